"""The reference service's endpoints: `/healthcheck`, gRPC health `ratelimit`, and the debug
address's `/rlconfig` and `POST /json`, on an in-process sidecar and a real process."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.net import http_call
from harness.rules import write_rules
from harness.sidecar import SidecarProcess
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.app.sidecar import Sidecar
from ratelimit_sidecar.config.loader import load_rules

RULES = """\
domain: gateway
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: path
        value: /v1/orders
        rate_limit: {unit: second, requests_per_unit: 5}
        shadow_mode: true
  - key: tier
    value: internal
    rate_limit: {unlimited: true}
"""
EXPECTED_RLCONFIG = (  # exact values first, then wildcards, then value-less keys
    "gateway.tier_internal: unit=UNKNOWN requests_per_unit=0, shadow_mode: false,"
    " quota_mode: false\n"
    "gateway.client: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n"
    "gateway.client.path_/v1/orders: unit=SECOND requests_per_unit=5, shadow_mode: true,"
    " quota_mode: false\n"
)


@pytest.fixture
async def sidecar(tmp_path: Path) -> AsyncIterator[Sidecar]:
    settings = Settings(
        config_path=str(tmp_path),
        grpc_address="127.0.0.1:0",
        metrics_address="127.0.0.1:0",
        debug_address="127.0.0.1:0",
    )
    server = Sidecar(settings, load_rules(write_rules(tmp_path, RULES)))
    await server.startup()
    yield server
    await server.shutdown()


async def _call(port: int, path: str, body: bytes | None = None) -> tuple[int, str]:
    return await asyncio.to_thread(http_call, port, path, body)


async def test_rlconfig_lists_every_limit_in_the_reference_format(sidecar: Sidecar) -> None:
    assert await _call(sidecar.debug.port, "/rlconfig") == (200, EXPECTED_RLCONFIG)


async def test_json_decides_like_should_rate_limit(sidecar: Sidecar) -> None:
    body = json.dumps({"domain": "gateway", "descriptors": [{"entries": [{"key": "client",
                      "value": "a"}]}]}).encode()  # fmt: skip
    answers = [await _call(sidecar.debug.port, "/json", body) for _ in range(3)]
    assert [status for status, _ in answers] == [200, 200, 429]
    first, last = json.loads(answers[0][1]), json.loads(answers[2][1])
    assert first["overallCode"] == "OK"
    assert first["statuses"][0]["currentLimit"] == {"requestsPerUnit": 2, "unit": "MINUTE"}
    assert first["statuses"][0]["limitRemaining"] == 1
    assert last["overallCode"] == "OVER_LIMIT"


@pytest.mark.parametrize(
    ("body", "code", "reason"),
    [
        (b"{not json", 400, "not a RateLimitRequest in JSON"),
        (b'{"domain": "gateway", "descriptors": 3}', 400, "not a RateLimitRequest in JSON"),
        (b'{"domain": "gateway", "nope": 1}', 400, "not a RateLimitRequest in JSON"),
        (b"\xff\xfe", 400, "not a RateLimitRequest in JSON"),
        (b'{"domain": "", "descriptors": []}', 400, "domain"),
    ],
)
async def test_malformed_json_bodies_are_refused_with_a_reason(
    sidecar: Sidecar, body: bytes, code: int, reason: str
) -> None:
    status, text = await _call(sidecar.debug.port, "/json", body)
    assert status == code
    assert reason in json.loads(text)["error"]["message"]
    assert await _call(sidecar.debug.port, "/rlconfig") == (200, EXPECTED_RLCONFIG)  # alive


async def test_debug_address_methods_and_paths(sidecar: Sidecar) -> None:
    assert (await _call(sidecar.debug.port, "/json"))[0] == 405
    assert (await _call(sidecar.debug.port, "/rlconfig", b"{}"))[0] == 405
    assert (await _call(sidecar.debug.port, "/metrics"))[0] == 404


async def test_the_debug_address_is_off_unless_set(tmp_path: Path) -> None:
    settings = Settings(
        config_path=str(tmp_path), grpc_address="127.0.0.1:0", metrics_address="127.0.0.1:0"
    )
    server = Sidecar(settings, load_rules(write_rules(tmp_path, RULES)))
    await server.startup()
    try:
        assert server.debug.port == 0
        assert await _call(server.http.port, "/healthcheck") == (200, "OK")
    finally:
        await server.shutdown()
    assert not server.endpoints.serving


def test_sigterm_turns_grpc_health_and_healthcheck_not_serving(tmp_path: Path) -> None:
    process = SidecarProcess(write_rules(tmp_path, RULES)).wait_ready()
    seen: dict[str, list[int]] = {"": [], "ratelimit": []}
    try:
        assert http_call(process.metrics_port, "/healthcheck") == (200, "OK")
        with grpc.insecure_channel(process.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            check = stub.Check(health_pb2.HealthCheckRequest(service="ratelimit"), timeout=2)
            assert check.status == health_pb2.HealthCheckResponse.SERVING
            watchers = [_watch(stub, name, seen[name]) for name in seen]
            for _ in range(100):  # each stream has said SERVING before the signal
                if all(seen.values()):
                    break
                time.sleep(0.02)
            process.proc.send_signal(signal.SIGTERM)
            for watcher in watchers:
                watcher.join(10)
    finally:
        process.stop()
    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    assert all(statuses == [serving, not_serving] for statuses in seen.values()), seen


def _watch(stub: health_pb2_grpc.HealthStub, name: str, out: list[int]) -> threading.Thread:
    """Record what a Watch stream of `name` says until the server ends it."""

    def run() -> None:
        try:
            for reply in stub.Watch(health_pb2.HealthCheckRequest(service=name), timeout=10):
                out.append(reply.status)
        except grpc.RpcError:
            pass  # the server closed the stream as it stopped

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


async def test_the_references_response_headers_when_asked(tmp_path: Path) -> None:
    settings = Settings(
        config_path=str(tmp_path),
        grpc_address="127.0.0.1:0",
        metrics_address="127.0.0.1:0",
        debug_address="127.0.0.1:0",
        limit_response_headers=True,
        limit_response_header_names="L,R,X-Reset",
    )
    server = Sidecar(settings, load_rules(write_rules(tmp_path, RULES)))
    await server.startup()
    try:
        body = json.dumps({"domain": "gateway", "descriptors": [{"entries": [{"key": "client",
                          "value": "h"}]}]}).encode()  # fmt: skip
        status, text = await _call(server.debug.port, "/json", body)
    finally:
        await server.shutdown()
    assert status == 200
    headers = {h["key"]: h["value"] for h in json.loads(text)["responseHeadersToAdd"]}
    assert (headers["L"], headers["R"]) == ("2", "1")
    assert 0 < int(headers["X-Reset"]) <= 60

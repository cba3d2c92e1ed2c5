"""`ratelimit`, started only with the reference's environment (Istio's sample, local ports)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.grpc_client import request, rls_stub
from harness.net import free_ports, http_call, wait_grpc_serving
from harness.process import stop_process
from harness.redis_servers import ServerProcess
from harness.sidecar import start_reference
from ratelimit_sidecar._proto import wire

RULES = """\
domain: echo-ratelimit
descriptors:
  - key: PATH
    value: "/"
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: PATH
    rate_limit: {unit: minute, requests_per_unit: 100}
"""


class Reference:
    """The `ratelimit` command with the Istio sample's variables, on free loopback ports."""

    def __init__(self, root: Path, redis: ServerProcess, **more: str) -> None:
        (root / "ratelimit" / "config").mkdir(parents=True)
        (root / "ratelimit" / "config" / "config.yaml").write_text(RULES)
        self.port, self.grpc_port, self.debug_port = free_ports(3)
        env = {"LOG_LEVEL": "debug", "REDIS_SOCKET_TYPE": "tcp",
               "REDIS_URL": f"127.0.0.1:{redis.port}", "USE_STATSD": "false",
               "RUNTIME_ROOT": str(root), "RUNTIME_SUBDIRECTORY": "ratelimit",
               "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true",
               "HOST": "127.0.0.1", "GRPC_HOST": "127.0.0.1", "PORT": str(self.port),
               "GRPC_PORT": str(self.grpc_port), "DEBUG_PORT": str(self.debug_port),
               "CACHE_KEY_PREFIX": "istio:", **more}  # fmt: skip
        self.proc = start_reference(env)
        self.address = f"127.0.0.1:{self.grpc_port}"
        self.stderr = ""

    def stop(self) -> None:
        _, err = stop_process(self.proc, timeout_s=20)
        self.stderr += err or ""


@pytest.fixture
def reference(tmp_path: Path, redis_server: ServerProcess) -> Iterator[Reference]:
    process = Reference(tmp_path, redis_server)
    try:
        wait_grpc_serving(process.address)
        yield process
    finally:
        process.stop()


def test_answers_from_the_mounted_rules_and_syncs_through_redis(
    reference: Reference, redis_server: ServerProcess
) -> None:
    with grpc.insecure_channel(reference.address) as channel:
        stub = rls_stub(channel)
        codes = [
            stub.ShouldRateLimit(request("echo-ratelimit", [("PATH", "/")]), timeout=5).overall_code
            for _ in range(3)
        ]
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="ratelimit"), timeout=5
        )
    assert codes == [wire.Code.OK, wire.Code.OK, wire.Code.OVER_LIMIT]
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    with redis_server.client() as client:
        deadline = time.monotonic() + 15  # one span of a minute window: 10 s
        while not client.keys("istio:*") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.keys("istio:*"), "no count reached the Redis of REDIS_URL"


def test_serves_the_references_endpoints(reference: Reference) -> None:
    assert http_call(reference.port, "/healthcheck") == (200, "OK")
    status, text = http_call(reference.port, "/metrics")
    assert status == 404  # the health port serves probes only
    status, text = http_call(reference.debug_port, "/rlconfig")
    assert status == 200
    assert "echo-ratelimit.PATH_/: unit=MINUTE requests_per_unit=2" in text
    entries = [{"key": "PATH", "value": "/x"}]
    body = json.dumps({"domain": "echo-ratelimit", "descriptors": [{"entries": entries}]})
    status, text = http_call(reference.debug_port, "/json", body.encode())
    assert status == 200
    assert json.loads(text)["statuses"][0]["currentLimit"]["requestsPerUnit"] == 100


def test_ignored_variables_are_logged_once_and_rls_variables_win(
    tmp_path: Path, redis_server: ServerProcess
) -> None:
    rls_port = free_ports(1)[0]
    process = Reference(
        tmp_path, redis_server, LOCAL_CACHE_SIZE_IN_BYTES="1024",
        RLS_GRPC_ADDRESS=f"127.0.0.1:{rls_port}",
    )  # fmt: skip
    try:
        wait_grpc_serving(f"127.0.0.1:{rls_port}")
    finally:
        process.stop()
    assert process.stderr.count("ignoring LOCAL_CACHE_SIZE_IN_BYTES: every decision") == 1
    assert process.stderr.count("ignoring USE_STATSD") == 1


def test_a_variable_that_cannot_be_honoured_stops_the_start(
    tmp_path: Path, redis_server: ServerProcess
) -> None:
    process = Reference(tmp_path, redis_server, BACKEND_TYPE="memcache")
    _, err = process.proc.communicate(timeout=30)
    assert process.proc.returncode == 2
    assert err.strip() == "ratelimit: error: BACKEND_TYPE='memcache': only redis is supported"

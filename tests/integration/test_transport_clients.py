"""Real gRPC clients against a sidecar process, on each transport: grpcio (C core),
@grpc/grpc-js (Node) and h2load (nghttp2) get the same answers from both."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from harness.grpc_client import request, rls_stub
from harness.h2raw import grpc_message
from harness.rules import write_rules
from harness.sidecar import SidecarProcess
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.app.settings import TRANSPORTS

CLIENTS = Path(__file__).parents[1] / "clients"
GRPC_JS = CLIENTS / "node_modules" / "@grpc" / "grpc-js"
INVALID_ARGUMENT, UNIMPLEMENTED = 3, 12


@pytest.fixture(scope="module", params=TRANSPORTS)
def sidecar(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[SidecarProcess]:
    rules = write_rules(tmp_path_factory.mktemp("clients"))
    process = SidecarProcess(rules, transport=request.param).wait_ready()
    yield process
    assert process.stop() == 0, process.stderr


def test_grpcio_decides_checks_health_and_reflects(sidecar: SidecarProcess) -> None:
    with grpc.insecure_channel(sidecar.address) as channel:
        stub = rls_stub(channel)
        replies = [stub.ShouldRateLimit(request("gateway", [("client", "io")])) for _ in range(4)]
        assert [r.overall_code for r in replies][-1] == wire.Code.OVER_LIMIT
        health = health_pb2_grpc.HealthStub(channel)
        check = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
        watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=5)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        ask = reflection_pb2.ServerReflectionRequest(list_services="")
        [answer] = list(reflect.ServerReflectionInfo(iter([ask]), timeout=5))
        names = {s.name for s in answer.list_services_response.service}
        assert {wire.SERVICE_NAME, "grpc.health.v1.Health"} <= names


def test_grpcio_gets_statuses_for_bad_calls(sidecar: SidecarProcess) -> None:
    with grpc.insecure_channel(sidecar.address) as channel:
        with pytest.raises(grpc.RpcError) as bad:
            rls_stub(channel).ShouldRateLimit(request("", [("a", "b")]), timeout=5)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "domain must not be empty" in (bad.value.details() or "")
        unknown = channel.unary_unary("/nope.Service/Nothing")
        with pytest.raises(grpc.RpcError) as missing:
            unknown(b"", timeout=5)
        assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as huge:
            channel.unary_unary(wire.METHOD_PATH)(b"\n" + b"x" * (5 << 20), timeout=10)
        assert huge.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_grpc_js_gets_the_same_answers(sidecar: SidecarProcess) -> None:
    node = shutil.which("node")
    if node is None or not GRPC_JS.is_dir():
        pytest.fail(
            "needs node and @grpc/grpc-js: `make install` runs npm install in tests/clients"
        )
    good = request("gateway", [("api_key", "js")]).SerializeToString()
    bad = request("", [("a", "b")]).SerializeToString()
    calls = [
        {"path": wire.METHOD_PATH, "body": base64.b64encode(good).decode()},
        {"path": wire.METHOD_PATH, "body": base64.b64encode(bad).decode()},
        {"path": "/nope.Service/Nothing", "body": ""},
    ]
    config = json.dumps({"address": sidecar.address, "calls": calls})
    done = subprocess.run(
        [node, str(CLIENTS / "grpc_js_calls.js"), config],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    ok, invalid, unknown = json.loads(done.stdout)
    reply = wire.RateLimitResponse.FromString(base64.b64decode(ok["body"]))
    assert (ok["code"], reply.overall_code) == (0, wire.Code.OK)
    assert (reply.statuses[0].current_limit.requests_per_unit) == 100
    assert invalid["code"] == INVALID_ARGUMENT and "domain must not be empty" in invalid["details"]
    assert unknown["code"] == UNIMPLEMENTED


def test_h2load_gets_every_answer(sidecar: SidecarProcess, tmp_path: Path) -> None:
    h2load = shutil.which("h2load")
    if h2load is None:
        pytest.fail("needs h2load: apt-get install nghttp2-client (bench/ensure-tools.sh does)")
    body = tmp_path / "body.bin"
    body.write_bytes(grpc_message(request("gateway", [("tier", "internal")]).SerializeToString()))
    argv = [h2load, "-n", "4000", "-c", "4", "-m", "16", "-d", str(body)]
    argv += ["-H", "content-type: application/grpc", "-H", "te: trailers"]
    done = subprocess.run(
        [*argv, f"http://{sidecar.address}{wire.METHOD_PATH}"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    counts = re.search(r"requests: 4000 total, .* (\d+) succeeded, (\d+) failed", done.stdout)
    assert counts is not None, done.stdout
    assert counts.groups() == ("4000", "0")
    assert "status codes: 4000 2xx" in done.stdout

"""ShouldRateLimit through a real grpc.aio server on loopback, in-process, local-only mode."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from harness.grpc_client import request, rls_stub
from harness.rules import write_rules
from harness.tls_proxy import make_cert
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.app.settings import TRANSPORTS, Settings
from ratelimit_sidecar.app.sidecar import Sidecar
from ratelimit_sidecar.bind import BindError
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.core import FleetLimiter, LocalLimiter, SyncBatch, TotalRead
from ratelimit_sidecar.grpc_server.rls import RateLimitServicer, build_server
from ratelimit_sidecar.grpc_server.tls import ServerTls, TlsFiles
from ratelimit_sidecar.grpc_server.transport.server import FastServer
from simulator.memory_store import MemoryStorage

T0 = 1_700_000_040_000  # a minute boundary
OK, OVER = wire.Code.OK, wire.Code.OVER_LIMIT


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=TRANSPORTS)
async def sidecar(
    tmp_path: Path, clock: Clock, request: pytest.FixtureRequest
) -> AsyncIterator[Sidecar]:
    rules = load_rules(write_rules(tmp_path))
    settings = Settings(
        config_path=str(tmp_path),
        grpc_address="127.0.0.1:0",
        max_descriptors=4,
        transport=request.param,
    )
    server = Sidecar(settings, rules, clock_ms=clock)
    await server.startup()
    yield server
    await server.shutdown()


@pytest.fixture
async def channel(sidecar: Sidecar) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sidecar.port}") as chan:
        yield chan


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> Any:
    return rls_stub(channel)


async def test_statuses_come_back_in_request_order(stub: Any) -> None:
    reply = await stub.ShouldRateLimit(
        request(
            "gateway",
            [("tier", "internal")],
            [("api_key", "k1"), ("path", "/v1/orders")],
            [("unknown", "x")],
            [("api_key", "k1")],
        )
    )
    assert reply.overall_code == OK
    unlimited, orders, unmatched, per_key = reply.statuses
    assert unlimited.limit_remaining == 2**32 - 1 and not unlimited.HasField("current_limit")
    assert orders.current_limit.requests_per_unit == 20
    assert orders.current_limit.name == "orders-writes"
    assert orders.current_limit.unit == wire.Unit.MINUTE
    assert orders.limit_remaining == 19
    assert not unmatched.HasField("current_limit") and unmatched.code == OK
    assert per_key.current_limit.requests_per_unit == 100 and per_key.limit_remaining == 99
    assert per_key.duration_until_reset.seconds == 60  # T0 is a minute boundary


async def test_over_limit_carries_retry_after_and_a_json_body(stub: Any, clock: Clock) -> None:
    replies = [await stub.ShouldRateLimit(request("gateway", [("client", "c")])) for _ in range(4)]
    assert [r.overall_code for r in replies] == [OK, OK, OK, OVER]
    over = replies[-1]
    headers = {h.key: h.value for h in over.response_headers_to_add}
    assert headers == {"retry-after": "2", "content-type": "application/json"}
    body = json.loads(over.raw_body)
    assert body["error"]["code"] == "RATE_LIMITED"
    assert (body["error"]["retry_after"], body["error"]["limit"], body["error"]["window"]) == (
        2,
        3,
        1,
    )
    assert over.statuses[0].code == OVER
    assert over.statuses[0].duration_until_reset.seconds == 2
    clock.now += 2000
    assert (await stub.ShouldRateLimit(request("gateway", [("client", "c")]))).overall_code == OK


async def test_hits_addend_rules(stub: Any) -> None:
    zero = await stub.ShouldRateLimit(request("gateway", [("client", "a")], hits_addend=0))
    assert zero.statuses[0].limit_remaining == 2  # request-level 0 counts as 1
    check = request("gateway", [("client", "a")], hits_addend=2, descriptor_hits=[0])
    assert (await stub.ShouldRateLimit(check)).statuses[0].limit_remaining == 2  # check only
    two = await stub.ShouldRateLimit(request("gateway", [("client", "a")], hits_addend=2))
    assert two.statuses[0].limit_remaining == 0


async def test_deny_list_and_shadow_mode(stub: Any) -> None:
    denied = await stub.ShouldRateLimit(request("gateway", [("blocked", "x")]))
    assert denied.overall_code == OVER
    shadow = await stub.ShouldRateLimit(request("gateway", [("remote_address", "10.9.1.2")]))
    assert shadow.overall_code == OK  # requests_per_unit 0, but shadow_mode
    # reported as the reference does: OK, with its limit and nothing remaining
    [status] = shadow.statuses
    assert (status.code, status.current_limit.requests_per_unit) == (OK, 0)
    assert status.limit_remaining == 0


async def test_unknown_domain_is_ok(stub: Any) -> None:
    reply = await stub.ShouldRateLimit(request("nope", [("a", "b")], [("c", "d")]))
    assert reply.overall_code == OK and len(reply.statuses) == 2


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (request("", [("a", "b")]), "domain must not be empty"),
        (request("gateway"), "descriptor list must not be empty"),
        (request("gateway", *[[("a", "b")]] * 5), "5 descriptors, more than the 4 allowed"),
        (request("gateway", [("a", "x" * 2000)]), "longer than 1024 bytes"),
        (request("gateway", []), "descriptor 0 has no entries"),
    ],
)
async def test_bad_input_gets_invalid_argument(
    stub: Any, message: wire.RateLimitRequest, reason: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.ShouldRateLimit(message)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in (caught.value.details() or "")


async def test_health_and_reflection_are_served(channel: grpc.aio.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = reflect.ServerReflectionInfo()
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    answer = await call.read()
    await call.done_writing()
    names = {s.name for s in answer.list_services_response.service}
    assert wire.SERVICE_NAME in names


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_shutdown_flushes_every_admitted_hit_to_a_shared_store(
    tmp_path: Path, clock: Clock, transport: str
) -> None:
    store = MemoryStorage()  # stands for a store other nodes read: every count must reach it
    settings = Settings(config_path=str(tmp_path), grpc_address="127.0.0.1:0", transport=transport)
    sidecar = Sidecar(settings, load_rules(write_rules(tmp_path)), store, clock_ms=clock)
    await sidecar.startup()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sidecar.port}") as chan:
        stub = rls_stub(chan)
        for i in range(10):
            await stub.ShouldRateLimit(request("gateway", [("api_key", f"k{i % 3}")]))
    limiter = sidecar.limiter
    assert isinstance(limiter, FleetLimiter)
    assert limiter.pending_hits() == 10
    assert await sidecar.shutdown() == 0
    assert limiter.pending_hits() == 0
    reads = [TotalRead(("gateway", "api_key", f"k{i}"), T0 // 60_000) for i in range(3)]
    assert store.execute(SyncBatch(T0, total_reads=reads)).totals == (4, 3, 3)


async def test_a_local_only_node_counts_in_memory_and_has_nothing_to_flush(
    sidecar: Sidecar, stub: Any
) -> None:
    for i in range(10):
        await stub.ShouldRateLimit(request("gateway", [("api_key", f"k{i % 3}")]))
    assert isinstance(sidecar.limiter, LocalLimiter) and sidecar.storage is None
    assert sorted(s.nodes.admitted for s in sidecar.limiter.keys) == [3, 3, 4]
    assert await sidecar.sync.flush() == 0


async def test_a_unix_socket_address_is_served_by_grpcio(
    tmp_path: Path, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    address = f"unix:{tmp_path}/rls.sock"
    settings = Settings(config_path=str(tmp_path), grpc_address=address)
    sidecar = Sidecar(settings, load_rules(write_rules(tmp_path)), clock_ms=clock)
    await sidecar.startup()
    try:
        async with grpc.aio.insecure_channel(address) as chan:
            reply = await rls_stub(chan).ShouldRateLimit(request("gateway", [("tier", "internal")]))
        assert reply.overall_code == OK
        assert (
            f"the fast transport cannot listen on {address}: serving it with grpcio" in caplog.text
        )
    finally:
        await sidecar.shutdown()


@pytest.mark.parametrize("transport", ["fast", "grpcio"])
async def test_tls_is_served_on_both_transports(tmp_path: Path, transport: str) -> None:
    cert, key = make_cert(tmp_path)
    handler = Sidecar(
        Settings(config_path=str(tmp_path), grpc_address="127.0.0.1:0"),
        load_rules(write_rules(tmp_path)),
    ).handler
    tls = ServerTls(TlsFiles(cert, key))
    server, _, port = build_server(
        RateLimitServicer(handler), "127.0.0.1:0", transport=transport, tls=tls
    )
    await server.start()
    try:
        trust = grpc.ssl_channel_credentials(cert.read_bytes())
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", trust) as chan:
            reply = await rls_stub(chan).ShouldRateLimit(request("gateway", [("tier", "x")]))
        assert reply.overall_code == OK
        assert isinstance(server, FastServer) == (transport == "fast")
    finally:
        await server.stop(None)


def test_a_required_client_san_is_refused_on_grpcio(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    tls = ServerTls(TlsFiles(cert, key, client_ca=cert, client_san="envoy"))
    handler = Sidecar(
        Settings(config_path=str(tmp_path), grpc_address="127.0.0.1:0"),
        load_rules(write_rules(tmp_path)),
    ).handler
    with pytest.raises(BindError, match="client-san is checked by the fast transport only"):
        build_server(RateLimitServicer(handler), "127.0.0.1:0", transport="grpcio", tls=tls)

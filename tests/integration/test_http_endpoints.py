"""The metrics address of an in-process sidecar: health, readiness, metrics, debug views."""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from harness.rules import write_rules
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.app.sidecar import Sidecar
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.http_server.server import HttpApi, text_reply
from ratelimit_sidecar.storage.keys import digest, value_digest


@pytest.fixture
async def sidecar(tmp_path: Path) -> AsyncIterator[Sidecar]:
    settings = Settings(
        config_path=str(tmp_path), grpc_address="127.0.0.1:0", metrics_address="127.0.0.1:0"
    )
    server = Sidecar(settings, load_rules(write_rules(tmp_path)))
    await server.startup()
    yield server
    await server.shutdown()


def fetch(sidecar: Sidecar, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{sidecar.http.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


async def traffic(sidecar: Sidecar, count: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sidecar.port}") as channel:
        stub = rls_stub(channel)
        for _ in range(count):
            await stub.ShouldRateLimit(request("gateway", [("client", "m")]))


async def test_health_readiness_and_unknown_paths(sidecar: Sidecar) -> None:
    assert await _fetch(sidecar, "/healthz") == (200, "ok\n")
    status, body = await _fetch(sidecar, "/readyz")
    ready = json.loads(body)
    assert status == 200 and ready["ready"] and ready["mode"] == "local-only"
    assert ready["config_version"] == sidecar.handler.rules.version
    assert (ready["store_up"], ready["store_error"], ready["store_key_errors"]) == (True, "", 0)
    assert (await _fetch(sidecar, "/nope"))[0] == 404


async def test_metrics_count_decisions_per_rule(sidecar: Sidecar) -> None:
    await traffic(sidecar, 5)  # limit 3 per second
    status, text = await _fetch(sidecar, "/metrics")
    assert status == 200
    labels = '{domain="gateway",rule="gateway.client"}'
    assert f"ratelimit_sidecar_total_hits_total{labels} 5.0" in text
    assert f"ratelimit_sidecar_within_limit_total{labels} 3.0" in text
    assert f"ratelimit_sidecar_over_limit_total{labels} 2.0" in text
    assert "ratelimit_sidecar_decision_seconds_count 1.0" in text  # one call in 16 is timed
    assert "ratelimit_sidecar_tracked_keys 1.0" in text


async def test_debug_views(sidecar: Sidecar) -> None:
    await traffic(sidecar, 2)
    rules = json.loads((await _fetch(sidecar, "/debug/rules"))[1])
    ids = {r["id"] for r in rules["domains"]["gateway"]}
    assert "gateway.api_key.path_/v1/orders" in ids
    keys = json.loads((await _fetch(sidecar, "/debug/keys?limit=5"))[1])
    assert keys["tracked"] == 1
    assert keys["keys"][0]["key"] == ["gateway", "client", value_digest("m")]
    assert keys["keys"][0]["digest"] == digest(("gateway", "client", "m"))
    assert keys["keys"][0]["local"] == 2
    assert (await _fetch(sidecar, "/debug/keys?limit=x"))[0] == 400


async def test_debug_keys_show_raw_values_only_when_asked(tmp_path: Path) -> None:
    settings = Settings(
        config_path=str(tmp_path),
        grpc_address="127.0.0.1:0",
        metrics_address="127.0.0.1:0",
        debug_show_values=True,
    )
    server = Sidecar(settings, load_rules(write_rules(tmp_path)))
    await server.startup()
    try:
        await traffic(server, 1)
        keys = json.loads((await _fetch(server, "/debug/keys"))[1])
    finally:
        await server.shutdown()
    assert keys["keys"][0]["key"] == ["gateway", "client", "m"]


async def _fetch(sidecar: Sidecar, path: str) -> tuple[int, str]:
    import asyncio

    return await asyncio.to_thread(fetch, sidecar, path)


async def test_slow_clients_are_cut_off_and_cannot_pile_up() -> None:
    api = HttpApi({"/healthz": lambda _q: text_reply("ok\n")}, timeout_s=0.3, max_connections=4)
    await api.start("127.0.0.1:0")
    clients = []
    try:
        clients = [await asyncio.open_connection("127.0.0.1", api.port) for _ in range(5)]
        oldest_reader = clients[0][0]
        # over the cap: the oldest connection that sent nothing made room, unanswered
        assert await _closed_without_answer(oldest_reader)
        for reader, _ in clients[1:]:  # sent nothing: a 400 and closed after the timeout
            answer = await asyncio.wait_for(reader.read(), 2)
            assert answer.startswith(b"HTTP/1.1 400")
        reader, writer = await asyncio.open_connection("127.0.0.1", api.port)
        clients.append((reader, writer))
        writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
        assert (await asyncio.wait_for(reader.read(), 2)).endswith(b"ok\n")
    finally:
        await _close_all(clients)
        await api.stop()


async def test_a_probe_is_answered_while_idle_clients_fill_the_cap() -> None:
    api = HttpApi({"/healthz": lambda _q: text_reply("ok\n")}, timeout_s=5, max_connections=4)
    await api.start("127.0.0.1:0")
    idle = [await asyncio.open_connection("127.0.0.1", api.port) for _ in range(12)]
    try:
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", api.port)
            idle.append((reader, writer))
            writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), 1)).endswith(b"ok\n")
    finally:
        await _close_all(idle)
        await api.stop()


async def test_a_client_whose_request_is_read_is_not_evicted() -> None:
    """Only connections still sending their head make room: a slow answer keeps its place."""
    release = asyncio.Event()

    async def slow(_q: dict[str, list[str]]) -> tuple[int, str, bytes]:
        await release.wait()
        return text_reply("slow\n")

    api = HttpApi({"/slow": slow}, timeout_s=5, max_connections=2)
    await api.start("127.0.0.1:0")
    clients = [await asyncio.open_connection("127.0.0.1", api.port) for _ in range(2)]
    try:
        for _, writer in clients:
            writer.write(b"GET /slow HTTP/1.1\r\n\r\n")
        await asyncio.sleep(0.2)  # both heads read: nothing left to evict
        late_reader, late_writer = await asyncio.open_connection("127.0.0.1", api.port)
        clients.append((late_reader, late_writer))
        assert await _closed_without_answer(late_reader)
        release.set()
        for reader, _ in clients[:2]:
            assert (await asyncio.wait_for(reader.read(), 2)).endswith(b"slow\n")
    finally:
        await _close_all(clients)
        await api.stop()


async def _closed_without_answer(reader: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), 1) == b""
    except ConnectionResetError:
        return True


async def _close_all(clients: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    for _, writer in clients:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

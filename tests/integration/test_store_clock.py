"""Spans follow Redis TIME: a node whose clock is off still counts in the store's windows."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from harness.redis_servers import Cluster, ServerProcess
from ratelimit_sidecar.config.model import Unit
from ratelimit_sidecar.core import Code, FleetLimiter, SyncBatch
from ratelimit_sidecar.storage.redis_urls import open_redis
from ratelimit_sidecar.sync.span_sync import SyncLoop
from ratelimit_sidecar.sync.store_clock import StoreClock, monotonic_wall_ms
from tests.unit.core.rules import hit, rule

pytestmark = pytest.mark.integration

PATIENT = "socket_timeout=3&socket_connect_timeout=3"
WINDOW_MS = 10_000
SKEW_MS = WINDOW_MS + 3_000  # more than a window: the local clock names another window


def redis_time_ms(admin: Any) -> int:
    seconds, micros = admin.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.parametrize("backend", ["standalone", "cluster"])
async def test_every_sync_reports_the_stores_clock(
    request: pytest.FixtureRequest, backend: str
) -> None:
    admin: Any
    if backend == "cluster":
        cluster: Cluster = request.getfixturevalue("redis_cluster")
        url, admin = cluster.url, cluster.client()
    else:
        server: ServerProcess = request.getfixturevalue("redis_server")
        url, admin = server.url, server.client()
    store = open_redis(f"{url}?{PATIENT}", f"t{uuid.uuid4().hex[:8]}:", "node-a")
    try:
        before = redis_time_ms(admin)
        result = await store.sync(SyncBatch(0))
        after = redis_time_ms(admin)
    finally:
        await store.close()
        admin.close()
    assert before <= result.store_time_ms <= after


async def test_a_node_with_a_skewed_clock_counts_in_the_stores_window(
    redis_server: ServerProcess,
) -> None:
    r = rule(rpu=100, unit=Unit.SECOND, multiplier=WINDOW_MS // 1000, spans=4)
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    store = open_redis(f"{redis_server.url}?{PATIENT}", prefix, "node-a")
    limiter = FleetLimiter()
    clock = StoreClock(lambda: monotonic_wall_ms() + SKEW_MS)
    loop = SyncLoop(limiter, store, timeout_ms=2_000, store_clock=clock)
    with redis_server.client() as admin:
        try:
            await loop.sync_once()  # the first sync learns the offset
            now, store_now = clock.now_ms(), redis_time_ms(admin)
            assert limiter.hit(now, [hit(r)]).code is Code.OK
            await loop.sync_once(flush=True)
            window = now // WINDOW_MS
            counted = admin.get(store.keys.counter(hit(r).key, window))
        finally:
            await store.close()
    assert abs(now - store_now) < 100
    assert window != (now - clock.offset_ms) // WINDOW_MS  # the local clock is a window off
    assert counted == b"1"


async def test_without_answers_from_the_store_the_local_clock_is_used(
    own_redis_server: ServerProcess,
) -> None:
    store = open_redis(f"{own_redis_server.url}?{PATIENT}", "t:", "node-a")
    clock = StoreClock(lambda: monotonic_wall_ms() + SKEW_MS)
    loop = SyncLoop(FleetLimiter(), store, timeout_ms=2_000, store_clock=clock)
    own_redis_server.stop()
    try:
        await loop.sync_once()
        assert not loop.store_up
        assert clock.offset_ms == 0
        assert abs(clock.now_ms() - (monotonic_wall_ms() + SKEW_MS)) < 100
    finally:
        await store.close()

"""Quiet keys against a real Redis: what the store sees of them, the near notice, the heartbeat.

Three nodes (FleetLimiter + SyncLoop + RedisStorage) on one virtual clock share a Redis; every
Redis command is counted from INFO commandstats (commands run inside scripts included).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from harness.redis_servers import ServerProcess
from ratelimit_sidecar.config.model import Unit
from ratelimit_sidecar.core import Code, FleetLimiter, Hit
from ratelimit_sidecar.storage.keys import digest
from ratelimit_sidecar.storage.redis_urls import open_redis
from ratelimit_sidecar.sync.fleet_blocks import FleetBlocks
from ratelimit_sidecar.sync.span_sync import SyncLoop, wall_clock_ms
from tests.unit.core.rules import rule

pytestmark = pytest.mark.integration

PATIENT = "socket_timeout=3&socket_connect_timeout=3"
T0 = 1_700_000_040_000  # a window boundary of RULE
RULE = rule(rpu=100, unit=Unit.SECOND, multiplier=60, spans=6)  # 100 a minute, 10 s spans
SPAN_MS = 10_000


class Fleet:
    """Three nodes on one clock the test moves."""

    def __init__(self, url: str) -> None:
        self.prefix = f"q{uuid.uuid4().hex[:8]}:"
        self.now = T0
        self.limiters = [FleetLimiter(key_digest=digest) for _ in range(3)]
        self.stores = [open_redis(f"{url}?{PATIENT}", self.prefix, f"n{i}") for i in range(3)]
        self.loops = [
            SyncLoop(limiter, store, lambda: self.now, timeout_ms=2_000)
            for limiter, store in zip(self.limiters, self.stores, strict=True)
        ]

    def hit(self, node: int, user: str) -> Code:
        return self.limiters[node].hit(self.now, [Hit(RULE, ("d", "k", user), 1)]).code

    async def sync_all(self, flush: bool = False) -> None:
        for loop in self.loops:
            await loop.sync_once(flush=flush)

    async def close(self) -> None:
        for store in self.stores:
            await store.close()


@pytest.fixture
async def fleet(redis_server: ServerProcess) -> AsyncIterator[Fleet]:
    nodes = Fleet(redis_server.url)
    await nodes.sync_all()  # the first heartbeats: three live nodes
    yield nodes
    await nodes.close()


def commands(admin: redis.Redis) -> int:
    """Every command Redis ran, inside scripts too, but not the INFO asking."""
    stats = admin.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


async def test_a_long_tail_of_users_costs_redis_no_command_per_user(
    fleet: Fleet, redis_server: ServerProcess
) -> None:
    with redis_server.client() as admin:
        before = commands(admin)
        for user in range(200):  # each user's two requests on two different nodes
            assert fleet.hit(user % 3, f"u{user}") is Code.OK
            assert fleet.hit((user + 1) % 3, f"u{user}") is Code.OK
        for _ in range(7):  # the window's six spans and one more: it has ended
            fleet.now += SPAN_MS
            await fleet.sync_all()
        spent = commands(admin) - before
        # Heartbeats only: one script per node and 10 s, 6 commands with the ones inside it.
        assert spent <= 3 * 7 * 6
        assert sum(limiter.quiet.hits for limiter in fleet.limiters) == 400
        assert not admin.keys(f"{fleet.prefix}{{*}}*")  # no counter was ever written


async def test_a_shutdown_pushes_every_held_hit(fleet: Fleet, redis_server: ServerProcess) -> None:
    for user in range(20):
        fleet.hit(0, f"u{user}")
    await fleet.loops[0].flush()
    with redis_server.client() as admin:
        window = fleet.now // 60_000
        counters = [
            admin.get(f"{fleet.prefix}{{{digest(('d', 'k', f'u{u}'))}}}:d:k:{window}")
            for u in range(20)
        ]
    assert counters == [b"1"] * 20


async def near_notices(fleet: Fleet, admin: Any, pushes: list[int]) -> list[bytes]:
    """Node 0 admits each of `pushes` hits of one key and syncs: what the near channel said."""
    listener = admin.pubsub()
    listener.subscribe(f"{fleet.prefix}events:near")
    listener.get_message(timeout=1.0)  # the subscription's confirmation
    for hits in pushes:
        for _ in range(hits):
            assert fleet.hit(0, "busy") is Code.OK
        fleet.now += SPAN_MS
        await fleet.loops[0].sync_once()
    said: list[bytes] = []
    for _ in range(20):
        message = listener.get_message(ignore_subscribe_messages=True, timeout=0.1)
        if message is not None:
            said.append(message["data"])
    listener.close()
    return said


async def test_a_window_near_its_limit_is_announced_to_every_node(
    fleet: Fleet, redis_server: ServerProcess
) -> None:
    blocks = [FleetBlocks(limiter, lambda: fleet.now) for limiter in fleet.limiters]
    with redis_server.client() as admin:
        said = await near_notices(fleet, admin, [60])  # node 0 alone: 60 of 100
    assert len(said) == 1
    for node in (1, 2):  # the other nodes hear it before they ever see the key
        blocks[node].handle_near(said[0])
    codes = [fleet.hit(1, "busy") for _ in range(45)]
    assert codes == [Code.OK] * 40 + [Code.OVER_LIMIT] * 5  # 60 + 40 = 100


async def test_a_key_alone_has_its_later_pushes_announced_too(
    fleet: Fleet, redis_server: ServerProcess
) -> None:
    """A node not tracking the key yet starts from the last total, not the crossing one."""
    blocks = FleetBlocks(fleet.limiters[1], lambda: fleet.now)
    fleet.limiters[0].live_nodes = 3  # its heartbeat came first: it counted itself alone
    with redis_server.client() as admin:
        said = await near_notices(fleet, admin, [30, 30, 20])
    assert [notice.rsplit(b"|", 1)[1] for notice in said] == [b"60", b"80"]
    for notice in said:
        blocks.handle_near(notice)
    codes = [fleet.hit(1, "busy") for _ in range(25)]
    assert codes == [Code.OK] * 20 + [Code.OVER_LIMIT] * 5  # 80 + 20 = 100


async def test_a_refused_heartbeat_is_counted_and_the_node_keeps_syncing(
    fleet: Fleet, redis_server: ServerProcess
) -> None:
    loop, live = fleet.loops[0], fleet.limiters[0].live_nodes
    with redis_server.client() as admin:
        admin.delete(f"{fleet.prefix}nodes")
        admin.set(f"{fleet.prefix}nodes", "not a sorted set")
    for _ in range(40):
        fleet.hit(0, "steady")
    fleet.now += SPAN_MS  # a heartbeat is due again
    stats = await loop.sync_once()
    assert stats.heartbeat_failed and loop.heartbeat_errors == 1
    assert loop.heartbeat_error.startswith("WRONGTYPE")  # what /readyz shows
    assert loop.store_up and stats.pushed_keys == 1  # the push itself went through
    assert fleet.limiters[0].live_nodes == live  # the last count stands


async def test_a_new_key_past_an_even_share_is_pushed_at_once(redis_server: ServerProcess) -> None:
    """On the real clock: a span of 10 s, and the push of a new key arrives in milliseconds."""
    prefix = f"q{uuid.uuid4().hex[:8]}:"
    limiter = FleetLimiter(key_digest=digest)
    store = open_redis(f"{redis_server.url}?{PATIENT}", prefix, "solo")
    loop = SyncLoop(limiter, store, timeout_ms=2_000)
    runner = asyncio.create_task(loop.run())
    try:
        await asyncio.sleep(0.2)  # the first sync: the heartbeat
        limiter.live_nodes = 4  # as if three more gateways were up
        key = ("d", "k", "early")
        for _ in range(26):  # 100 / 4 = 25: the 26th asks for the push
            limiter.hit(wall_clock_ms(), [Hit(RULE, key, 1)])
        window = wall_clock_ms() // 60_000
        counter = f"{prefix}{{{digest(key)}}}:d:k:{window}"
        with redis_server.client() as admin:
            for _ in range(100):
                if admin.get(counter) is not None:
                    break
                await asyncio.sleep(0.01)
            assert admin.get(counter) == b"26"
    finally:
        loop.stop()
        await runner
        await store.close()

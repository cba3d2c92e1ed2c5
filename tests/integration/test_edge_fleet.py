"""Keys at the edge against a real Redis (core/edge.py): the switch, announced on the near
channel and heard by the other nodes, the push of their unsynced hits, and the fallback.

Three nodes (FleetLimiter + SyncLoop + RedisStorage) on one virtual clock share a Redis
(tests/integration/test_quiet_keys.py's fleet).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from harness.redis_servers import ServerProcess
from ratelimit_sidecar.config.model import Unit
from ratelimit_sidecar.core import Code, Hit, SyncBatch
from ratelimit_sidecar.core.types import Push
from ratelimit_sidecar.storage.keys import digest
from ratelimit_sidecar.sync.fleet_blocks import FleetBlocks
from simulator.notices import announces_edge
from tests.integration.test_quiet_keys import Fleet as QuietFleet
from tests.unit.core.rules import rule

pytestmark = pytest.mark.integration

PLAIN = rule(rpu=100, unit=Unit.SECOND, multiplier=60, spans=6)  # 100 a minute, 10 s spans
assert PLAIN.limit is not None
EDGE_LIMIT = replace(PLAIN.limit, edge=True)
RULE = replace(PLAIN, limit=EDGE_LIMIT, limits=(EDGE_LIMIT,))
SPAN_MS = 10_000
KEY = ("d", "k", "hot")


class Fleet(QuietFleet):
    """Three nodes on one clock the test moves, each with its notices' handler."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.blocks = [FleetBlocks(limiter, lambda: self.now) for limiter in self.limiters]

    def hits(self, node: int, n: int = 1) -> list[Code]:
        limiter = self.limiters[node]
        return [limiter.hit(self.now, [Hit(RULE, KEY, 1)]).code for _ in range(n)]

    def counter(self) -> str:
        return f"{self.prefix}{{{digest(KEY)}}}:d:k:{self.now // 60_000}"


async def near_the_limit(fleet: Fleet, per_node: int) -> None:
    """`per_node` hits on each node, then two span ends: every node knows the total."""
    for node in range(3):
        fleet.hits(node, per_node)
    for _ in range(2):
        fleet.now += SPAN_MS
        for loop in fleet.loops:
            await loop.sync_once()


def edge_notice(listener: Any) -> bytes | None:
    """The first push at the edge the near channel carried (a crossing of NEAR_SHARE too)."""
    for _ in range(20):
        message = listener.get_message(ignore_subscribe_messages=True, timeout=0.2)
        if message is not None and message["data"].endswith(b"|e"):
            return bytes(message["data"])
    return None


@pytest.fixture
async def fleet(redis_server: ServerProcess) -> AsyncIterator[Fleet]:
    nodes = Fleet(redis_server.url)
    for loop in nodes.loops:  # the first heartbeats: three live nodes
        await loop.sync_once()
    yield nodes
    await nodes.close()


async def test_the_switch_is_announced_and_every_node_pushes_its_unsynced_hits(
    fleet: Fleet, redis_server: ServerProcess
) -> None:
    with redis_server.client() as admin:
        listener = admin.pubsub()
        listener.subscribe(f"{fleet.prefix}events:near")
        listener.get_message(timeout=1.0)  # the subscription's confirmation
        for node in range(3):
            fleet.hits(node, 18)
        fleet.now += SPAN_MS
        for loop in fleet.loops:  # 54 of 100 after a sixth of the window: node 2 at the edge
            await loop.sync_once()
        assert fleet.limiters[2].keys.get(KEY).window_counts().edge  # type: ignore[union-attr]
        assert not fleet.limiters[1].keys.get(KEY).window_counts().edge  # type: ignore[union-attr]
        fleet.hits(1, 4)  # node 1 saw 36: its hits wait for the span end
        fleet.now += 1
        assert fleet.limiters[1].early.due_ms is None
        assert fleet.hits(2) == [Code.OK]
        assert fleet.limiters[2].early.due_ms is not None  # a push within a period
        fleet.now = fleet.limiters[2].early.due_ms
        await fleet.loops[2].sync_once()
        notice = edge_notice(listener)
        listener.close()
        assert notice is not None and notice.endswith(b"|55|e")
        fleet.blocks[1].handle_near(notice)
        assert fleet.blocks[1].edge_received == 1
        assert fleet.limiters[1].early.due_ms == fleet.now  # its 4 hits: at once
        stats = await fleet.loops[1].sync_once()
        assert stats.pushed_keys == 1
        assert admin.get(fleet.counter()) == b"59"


async def test_a_key_at_the_edge_is_held_to_its_limit(
    fleet: Fleet, redis_server: ServerProcess
) -> None:
    """Each node admits at the edge only what the store's total leaves, pushed at once on a
    burst and announced to the others: the window ends at MAX, not MAX plus each node's share."""
    await near_the_limit(fleet, 25)  # 75 of 100 after a third: every node at the edge
    admitted = 75
    with redis_server.client() as admin:
        listener = admin.pubsub()
        listener.subscribe(f"{fleet.prefix}events:near")
        listener.get_message(timeout=1.0)
        for _ in range(40):  # the three nodes in turn; the store's notices reach every node
            fleet.now += 100
            for node, loop in enumerate(fleet.loops):
                admitted += fleet.hits(node, 2).count(Code.OK)
                due = fleet.limiters[node].early.due_ms
                if due is not None and due <= fleet.now:
                    await loop.sync_once()
                while message := listener.get_message(ignore_subscribe_messages=True, timeout=0.02):
                    for blocks in fleet.blocks:
                        blocks.handle_near(message["data"])
        listener.close()
        assert int(admin.get(fleet.counter()) or 0) == admitted
    assert 100 <= admitted <= 101  # the edge's ceiling: MAX x (1 + 1 %) at most


async def test_with_the_store_down_the_edge_falls_back_to_local_thresholds(
    fleet: Fleet, redis_server: ServerProcess
) -> None:
    await near_the_limit(fleet, 25)
    redis_server.pause()
    try:
        fleet.now += 1
        assert fleet.hits(0) == [Code.OK]  # at the edge: a push is asked for
        loop = fleet.loops[0]
        fleet.now = fleet.limiters[0].early.due_ms or fleet.now
        await loop.sync_once()  # no answer: the store is down
        assert not loop.store_up and not fleet.limiters[0].store_up
        codes = fleet.hits(0, 30)  # every request answered from memory, none waits
        assert codes.count(Code.OK) < 25  # the local thresholds hold the node to its share
        fleet.now += 1
        fleet.hits(0, 3)
        assert fleet.limiters[0].early.due_ms is None  # no early pushes without a store
    finally:
        redis_server.resume()
    fleet.now += SPAN_MS
    await fleet.loops[0].sync_once()
    assert fleet.loops[0].store_up


async def test_redis_announces_pushes_at_the_edge_as_the_simulator_does(
    fleet: Fleet, redis_server: ServerProcess
) -> None:
    """sync.lua against simulator/notices.py `announces_edge`: every push that adds to a total
    not yet past MAX, however far from half of it; a read, or a push past MAX, says nothing."""
    store, window = fleet.stores[0], fleet.now // 60_000
    pushes = [(1, True), (60, True), (0, True), (45, True), (5, True), (3, True), (2, False)]
    expected, total = [], 0
    with redis_server.client() as admin:
        listener = admin.pubsub()
        listener.subscribe(f"{fleet.prefix}events:near")
        listener.get_message(timeout=1.0)
        for hits, edge in pushes:
            push = Push(KEY, window, hits, EDGE_LIMIT, edge=edge)
            answer = await store.sync(SyncBatch(fleet.now, [push]))
            total += hits
            assert answer.pushes[0].total == total
            expected.append(announces_edge(push, total))
        said = []
        while message := listener.get_message(ignore_subscribe_messages=True, timeout=0.2):
            said.append(bytes(message["data"]))
        listener.close()
    edge_said = [int(notice.split(b"|")[2]) for notice in said if notice.endswith(b"|e")]
    assert expected == [True, True, False, True, False, False, False]  # 106: past MAX
    assert edge_said == [1, 61, 106]

"""Blocks that reach every node at once: the blocks channel, applied to this node's keys.

Redis announces each block it starts (storage/blocks.py); every node subscribed applies it to
its own counter of that key through the core (`FleetLimiter.apply_block`), so a node that did
not push the crossing refuses within milliseconds instead of at its next span end. Nothing
here runs on the request path: the handler runs on the event loop when a message arrives (a
parse, a dict lookup and, after new keys, a catch-up of the digest index of at most 500 keys;
after more, the index is rebuilt in slices between requests and the notice waits for it).

Pub/sub is only the fast path. A message published while this node's subscription is down is
lost; the node then learns the block as before, from the flag its next span-end sync reads.
The subscriber (storage/subscriber.py) reconnects by itself and logs it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ratelimit_sidecar.core import FleetLimiter
from ratelimit_sidecar.metrics.labels import NS
from ratelimit_sidecar.storage.blocks import (
    BLOCKS,
    NEAR,
    BlockNotice,
    DigestIndex,
    parse_near,
    parse_notice,
)
from ratelimit_sidecar.storage.keys import KeySchema
from ratelimit_sidecar.storage.redis_store import RedisStorage
from ratelimit_sidecar.storage.subscriber import Subscriber

log = logging.getLogger("ratelimit_sidecar.blocks")
MAX_WAITING = 1000  # notices kept while the key table is being indexed


class FleetBlocks:
    """Applies announced blocks to the limiter's keys; counts what it received and applied."""

    def __init__(self, limiter: FleetLimiter, clock_ms: Callable[[], int]) -> None:
        self.limiter = limiter
        self.index = DigestIndex(limiter.keys)
        self._clock_ms = clock_ms
        self.received = 0  # well-formed notices
        self.applied = 0  # ... that blocked a key of this node (or blocked it longer)
        self.malformed = 0
        self.near_received = 0  # near notices (core/quiet_keys.py)
        self.edge_received = 0  # of them, pushes at the edge (core/edge.py)
        self._rebuilding: asyncio.Task[None] | None = None
        self._waiting: list[tuple[BlockNotice, int]] = []  # notices for keys not indexed yet

    def handle(self, data: bytes) -> None:
        """One message of the blocks channel."""
        notice = parse_notice(data)
        if notice is None:
            self.malformed += 1
            if self.malformed == 1:  # once: a foreign publisher must not flood the log
                log.warning("ignoring a malformed message on the blocks channel: %.60r", data)
            return
        self.received += 1
        now = self._clock_ms()
        if not self._apply(notice, notice.left_ms, now) and self.index.rebuild_wanted:
            self._wait(notice, now)

    def handle_near(self, data: bytes) -> None:
        """One message of the near channel: a window another node's push took near its limit.
        A tracked key is synced every span from now on; an untracked one's total waits for
        its first request here (core/quiet_keys.py `HeardTotals`)."""
        notice = parse_near(data)
        if notice is None:
            self.malformed += 1
            return
        self.near_received += 1
        self.edge_received += notice.edge
        key = self.index.find(notice.digest)
        now = self._clock_ms()
        self.limiter.apply_near(key, notice.digest, notice.window, notice.total, now, notice.edge)

    def _apply(self, notice: BlockNotice, left_ms: int, now_ms: int) -> bool:
        key = self.index.find(notice.digest)
        if key is None or not self.limiter.apply_block(
            key, left_ms, now_ms, notice.level, notice.set_for
        ):
            return False
        self.applied += 1
        return True

    def _wait(self, notice: BlockNotice, now_ms: int) -> None:
        """The index does not know every key yet (the first notice after a long quiet spell):
        keep the notice until the key table is indexed, in slices beside requests."""
        if len(self._waiting) < MAX_WAITING:
            self._waiting.append((notice, now_ms))
        if self._rebuilding is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside an event loop (tests): at once
            for _ in self.index.rebuild_steps():
                pass
            self._apply_waiting()
            return
        self._rebuilding = loop.create_task(self._rebuild(), name="block-index")

    async def _rebuild(self) -> None:
        try:
            for _ in self.index.rebuild_steps():
                await asyncio.sleep(0)
            self._apply_waiting()
        finally:
            self._rebuilding = None

    def _apply_waiting(self) -> None:
        """The notices kept during a rebuild, for what is left of their blocks."""
        now, waiting, self._waiting = self._clock_ms(), self._waiting, []
        for notice, received_ms in waiting:
            left_ms = notice.left_ms - (now - received_ms)
            if left_ms > 0:
                self._apply(notice, left_ms, now)


def subscribe_blocks(
    subscriber: Subscriber,
    keys: KeySchema,
    limiter: FleetLimiter,
    clock_ms: Callable[[], int],
) -> FleetBlocks:
    """Handle the blocks channel of `keys`' deployment on `subscriber` (before it runs)."""
    blocks = FleetBlocks(limiter, clock_ms)
    subscriber.on(keys.channel(BLOCKS), blocks.handle)
    subscriber.on(keys.channel(NEAR), blocks.handle_near)
    return blocks


class BlocksCollector(Collector):
    """Announced blocks received and applied, and whether the subscription is up, at scrape."""

    def __init__(self, blocks: FleetBlocks, subscriber: Subscriber) -> None:
        self._blocks, self._subscriber = blocks, subscriber

    def collect(self) -> Iterable[Metric]:
        blocks = self._blocks
        yield CounterMetricFamily(
            f"{NS}_fleet_blocks_received",
            "Blocks announced by Redis (pub/sub) to this node",
            value=blocks.received,
        )
        yield CounterMetricFamily(
            f"{NS}_fleet_blocks_applied",
            "Announced blocks that blocked a key of this node at once",
            value=blocks.applied,
        )
        yield CounterMetricFamily(
            f"{NS}_fleet_near_received",
            "Windows announced near their limit (core/quiet_keys.py)",
            value=blocks.near_received,
        )
        yield CounterMetricFamily(
            f"{NS}_edge_notices_received",
            "Pushes of keys at the edge announced to this node (core/edge.py)",
            value=blocks.edge_received,
        )
        yield GaugeMetricFamily(
            f"{NS}_subscription_up",
            "The pub/sub subscription is connected (else blocks arrive at span ends)",
            value=int(self._subscriber.connected),
        )


def wire_blocks(
    storage: object,
    limiter: object,
    clock_ms: Callable[[], int],
    registry: CollectorRegistry,
    subscriber: Subscriber | None = None,
) -> tuple[Subscriber | None, FleetBlocks | None]:
    """The node's subscriber (`subscriber`, or a new one on the store's client) with the
    blocks channel handled and its metrics registered, when counts go to Redis; else (None,
    None): nothing to subscribe to. The caller runs the subscriber."""
    if not isinstance(storage, RedisStorage) or not isinstance(limiter, FleetLimiter):
        return None, None
    subscriber = subscriber or Subscriber(storage.client)
    blocks = subscribe_blocks(subscriber, storage.keys, limiter, clock_ms)
    registry.register(BlocksCollector(blocks, subscriber))
    return subscriber, blocks

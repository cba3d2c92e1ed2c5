"""Blocks that reach every node at once: the blocks channel, applied to this node's keys.

Redis announces each block it starts (storage/blocks.py); every node subscribed applies it to
its own counter of that key through the core (`FleetLimiter.apply_block`), so a node that did
not push the crossing refuses within milliseconds instead of at its next span end. Nothing
here runs on the request path: the handler runs on the event loop when a message arrives (a
parse, a dict lookup and, after new keys, a short catch-up of the digest index).

Pub/sub is only the fast path. A message published while this node's subscription is down is
lost; the node then learns the block as before, from the flag its next span-end sync reads.
The subscriber (storage/subscriber.py) reconnects by itself and logs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ratelimit_sidecar.core import FleetLimiter
from ratelimit_sidecar.storage.blocks import BLOCKS, DigestIndex, parse_notice
from ratelimit_sidecar.storage.keys import KeySchema
from ratelimit_sidecar.storage.redis_store import RedisStorage
from ratelimit_sidecar.storage.subscriber import Subscriber

log = logging.getLogger("ratelimit_sidecar.blocks")
NS = "ratelimit_sidecar"


class FleetBlocks:
    """Applies announced blocks to the limiter's keys; counts what it received and applied."""

    def __init__(self, limiter: FleetLimiter, clock_ms: Callable[[], int]) -> None:
        self.limiter = limiter
        self.index = DigestIndex(limiter.keys)
        self._clock_ms = clock_ms
        self.received = 0  # well-formed notices
        self.applied = 0  # ... that blocked a key of this node (or blocked it longer)
        self.malformed = 0

    def handle(self, data: bytes) -> None:
        """One message of the blocks channel."""
        notice = parse_notice(data)
        if notice is None:
            self.malformed += 1
            if self.malformed == 1:  # once: a foreign publisher must not flood the log
                log.warning("ignoring a malformed message on the blocks channel: %.60r", data)
            return
        self.received += 1
        key = self.index.find(notice.digest)
        if key is not None and self.limiter.apply_block(
            key, notice.left_ms, self._clock_ms(), notice.level
        ):
            self.applied += 1


def subscribe_blocks(
    subscriber: Subscriber,
    keys: KeySchema,
    limiter: FleetLimiter,
    clock_ms: Callable[[], int],
) -> FleetBlocks:
    """Handle the blocks channel of `keys`' deployment on `subscriber` (before it runs)."""
    blocks = FleetBlocks(limiter, clock_ms)
    subscriber.on(keys.channel(BLOCKS), blocks.handle)
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
) -> tuple[Subscriber | None, FleetBlocks | None]:
    """The node's subscriber with the blocks channel handled and its metrics registered, when
    counts go to Redis (else nothing to subscribe to: (None, None)). The caller runs it."""
    if not isinstance(storage, RedisStorage) or not isinstance(limiter, FleetLimiter):
        return None, None
    subscriber = Subscriber(storage.client)
    blocks = subscribe_blocks(subscriber, storage.keys, limiter, clock_ms)
    registry.register(BlocksCollector(blocks, subscriber))
    return subscriber, blocks

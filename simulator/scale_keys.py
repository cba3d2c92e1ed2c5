"""What one key costs the shared store, found by running the real core on a virtual clock.

A key with a given request rate per gateway is offered to a sample of gateways, each a real
`FleetLimiter` on the real `SyncSchedule`; every sync is packed by the real `SyncCodec` and
applied by the in-process store. The sample stands for the whole fleet: each sampled push
counts as `gateways / sample` pushes at the store, and the heartbeat answers the fleet's node
count, so the core sees the totals and the node count a full fleet would give it; a push that
takes the key near its limit is announced to every sampled gateway, as the store's near notice
is. A new key's early push wakes its gateway at once, as it wakes the sync loop. What the
codec would send is counted per sync: script entries by kind (with hits under the limit, with
hits over it, without hits), GETs, and per sync the commands that are not about any key.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from random import Random

from ratelimit_sidecar.config.model import RateLimit, Rule, Unit
from ratelimit_sidecar.core import (
    Code,
    FleetLimiter,
    Hit,
    PushResult,
    SyncBatch,
    SyncResult,
    SyncSchedule,
)
from ratelimit_sidecar.storage.codec import SyncCodec
from ratelimit_sidecar.storage.keys import KeySchema, digest
from simulator.memory_store import MemoryStorage
from simulator.notices import announces_near

MAX_SAMPLE = 10  # gateways simulated per key; more stand in through the store's scaling
NODE_TTL_MS = 30_000
ARRIVALS_WANTED = 200  # requests per simulated key class, for a stable average
MAX_WINDOWS = 4000
ARRIVE, SYNC = 0, 1
KEY = ("scale", "user", "u")


@dataclass(frozen=True, slots=True)
class KeyLoad:
    """One key's traffic: each of `gateways` gets `per_gateway_rps` of it on average."""

    gateways: int
    per_gateway_rps: float
    limit: int = 100
    window_ms: int = 60_000
    spans: int = 6

    def rule(self) -> Rule:
        seconds = self.window_ms // 1000
        rate = RateLimit(self.limit, Unit.SECOND, unit_multiplier=seconds, spans=self.spans)
        return Rule("scale", (("user", ""),), rate)


@dataclass(slots=True)
class KeyCost:
    """Per window of the key, over the whole fleet (the sample scaled up)."""

    entries: dict[str, float] = field(default_factory=lambda: {"under": 0, "over": 0, "read": 0})
    gets: float = 0.0
    syncs_with_work: float = 0.0  # syncs of a gateway that carried this key
    offered: float = 0.0
    admitted: float = 0.0
    over_admitted: float = 0.0  # admitted beyond the limit, summed over windows
    refused_under: float = 0.0  # refused while the window's offered count fit the limit

    def scaled(self, factor: float) -> KeyCost:
        entries = {kind: n * factor for kind, n in self.entries.items()}
        return KeyCost(
            entries,
            self.gets * factor,
            self.syncs_with_work * factor,
            self.offered * factor,
            self.admitted * factor,
            self.over_admitted * factor,
            self.refused_under * factor,
        )


def sample_size(gateways: int) -> int:
    """The largest divisor of `gateways` up to MAX_SAMPLE: each sampled push then stands for
    a whole number of pushes."""
    return max(d for d in range(1, min(gateways, MAX_SAMPLE) + 1) if gateways % d == 0)


def windows_for(load: KeyLoad, sample: int) -> int:
    """Windows to simulate so the sample sees about ARRIVALS_WANTED requests (at least 3)."""
    per_window = load.per_gateway_rps * sample * load.window_ms / 1000
    return max(3, min(MAX_WINDOWS, math.ceil(ARRIVALS_WANTED / max(per_window, 1e-9))))


class KeySim:
    """`sample` gateways, one key, an in-process store; counts from the second window on."""

    def __init__(self, load: KeyLoad, seed: int = 1) -> None:
        self.load, self.rng = load, Random(seed)
        self.sample = sample_size(load.gateways)
        self.scale = load.gateways // self.sample
        self.windows = windows_for(load, self.sample)
        self.now = 0
        self.store = MemoryStorage(lambda: self.now, NODE_TTL_MS)
        self.codec = SyncCodec(KeySchema("rls:"), cluster=False, node_id="g", node_ttl_ms=1)
        self.limiters = [FleetLimiter(16, key_digest=digest) for _ in range(self.sample)]
        for limiter in self.limiters:  # running gateways: each knows the live node count
            limiter.apply_sync(0, limiter.end_span(0), SyncResult(live_nodes=load.gateways))
        self.schedules = [SyncSchedule(0) for _ in range(self.sample)]
        self.waking: list[int | None] = [None] * self.sample
        self.hits = [Hit(load.rule(), KEY, 1)]
        self.heap: list[tuple[int, int, int]] = []
        self.cost = KeyCost()
        self.admitted_in: dict[int, int] = {}  # sampled requests per window index
        self.offered_in: dict[int, int] = {}

    def run(self) -> KeyCost:
        """The key's cost per window, over the whole fleet."""
        window = self.load.window_ms
        end = (self.windows + 1) * window
        for gateway in range(self.sample):
            self._arrival(gateway, 0)
        while self.heap and self.heap[0][0] < end:
            self.now, kind, gateway = heapq.heappop(self.heap)
            self._request(gateway) if kind == ARRIVE else self._sync(gateway)
        limit, scale = self.load.limit, self.scale
        for index, offered in self.offered_in.items():
            if 1 <= index <= self.windows:
                admitted = self.admitted_in.get(index, 0) * scale
                self.cost.over_admitted += max(0, admitted - limit) / scale
                self.cost.refused_under += max(0, min(offered * scale, limit) - admitted) / scale
        return self.cost.scaled(self.scale / self.windows)

    def _counting(self) -> bool:
        return self.now >= self.load.window_ms

    def _arrival(self, gateway: int, after: int) -> None:
        gap = self.rng.expovariate(self.load.per_gateway_rps / 1000)
        heapq.heappush(self.heap, (after + max(1, round(gap)), ARRIVE, gateway))

    def _request(self, gateway: int) -> None:
        self._arrival(gateway, self.now)
        admitted = self.limiters[gateway].hit(self.now, self.hits).code is Code.OK
        if self._counting():
            self.cost.offered += 1
            self.cost.admitted += admitted
        index = self.now // self.load.window_ms
        self.offered_in[index] = self.offered_in.get(index, 0) + 1
        self.admitted_in[index] = self.admitted_in.get(index, 0) + admitted
        early = self.limiters[gateway].early.due_ms == self.now  # a new key's early push
        if self.waking[gateway] is None or early:
            self._plan(gateway)

    def _plan(self, gateway: int) -> None:
        """As the sync loop: the next span end of a tracked key, or a heartbeat while any hit
        is unconfirmed; a gateway with neither does no work for this key until it sees it."""
        limiter, schedule = self.limiters[gateway], self.schedules[gateway]
        span_end, unconfirmed = limiter.next_span_end(self.now), limiter.pending_hits() > 0
        if span_end is None and not unconfirmed:
            self.waking[gateway] = None
            return
        # A heartbeat sync only plans keys whose span ended: it can carry this key's work
        # only while the key holds unconfirmed hits, so only then is it simulated.
        due = schedule.next_sync(span_end) if unconfirmed or span_end is None else span_end
        wake = max(due, self.now + 1)
        self.waking[gateway] = wake
        heapq.heappush(self.heap, (wake, SYNC, gateway))

    def _sync(self, gateway: int) -> None:
        if self.waking[gateway] != self.now:
            return  # superseded
        limiter = self.limiters[gateway]
        batch = limiter.end_span(self.now)
        result = SyncResult(live_nodes=self.load.gateways, store_time_ms=self.now)
        if batch:  # an empty one is a heartbeat: the store's only answer is the node count
            result = self.store.execute(self._scaled(batch), node_id=f"g{gateway}")
            result = replace(result, live_nodes=self.load.gateways)
            if self._counting():
                self._count(batch, result.pushes)
            self._announce_near(batch, result.pushes)
        limiter.apply_sync(self.now, batch, result)
        self.schedules[gateway].synced(self.now)
        self._plan(gateway)

    def _announce_near(self, batch: SyncBatch, answers: tuple[PushResult, ...]) -> None:
        """The store's near notices (sync.lua, over pub/sub): a push that takes a window to
        near its limit tells every node, handled as the server's fleetblocks.py does."""
        for push, answer in zip(batch.pushes, answers, strict=True):
            if not announces_near(push.limit, answer.total, push.hits * self.scale, push.announce):
                continue
            for limiter in self.limiters:
                limiter.apply_near(push.key, digest(push.key), push.window, answer.total, self.now)

    def _scaled(self, batch: SyncBatch) -> SyncBatch:
        """The batch as the whole fleet's share of it reaches the store."""
        pushes = [push._replace(hits=push.hits * self.scale) for push in batch.pushes]
        return replace(batch, pushes=pushes)

    def _count(self, batch: SyncBatch, answers: tuple[PushResult, ...]) -> None:
        layout = self.codec.encode(batch).layout
        entries = self.cost.entries
        for push, answer in zip(batch.pushes, answers, strict=True):
            over = answer.total > self.load.limit
            kind = "read" if push.hits == 0 else "over" if over else "under"
            entries[kind] += 1
        self.cost.gets += layout.total_reads
        self.cost.syncs_with_work += bool(layout.pushes or layout.total_reads)


def key_cost(load: KeyLoad, seed: int = 1) -> KeyCost:
    return KeySim(load, seed).run()

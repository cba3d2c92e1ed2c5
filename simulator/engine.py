"""The discrete-event loop: virtual nodes running the real core against one shared store.

Time is integer milliseconds of a true clock, which is also the store's clock. Each node has
its own limiter and sees `true + offset`. A node syncs on the core's `SyncSchedule`, as the
server's sync loop does: `end_span`, call the store with the schedule's timeout, `apply_sync`
with the answer (or None, and whether the pushes may be resent), then wake at the schedule's
next sync. The server's loop polls for a rule that just became active; here that is an exact
re-plan when a node's first key appears. A round trip of L ms reaches the store at +L/2 and is
answered at +L; requests in between see the state from before the answer. Past the timeout the
node falls back while the store still applies the INCRBY, exactly as a real timed-out Redis
call does. The store's pub/sub notices (a window near its limit, a block that starts) reach
every node half a round trip after the push that caused them. Local-only nodes (the `local`
baseline) have no store and no sync at all.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from random import Random

from ratelimit_sidecar.config.model import Rule
from ratelimit_sidecar.core import (
    Code,
    FleetLimiter,
    Hit,
    Limiter,
    LocalLimiter,
    SyncBatch,
    SyncResult,
    SyncSchedule,
)
from ratelimit_sidecar.core.schedule import FLUSH_ATTEMPTS
from ratelimit_sidecar.storage.errors import StoreError, StoreUnavailable
from ratelimit_sidecar.storage.keys import digest
from simulator import notices
from simulator.envoy_quota import REPORT_PERIOD_MS
from simulator.memory_store import MemoryStorage
from simulator.metrics import Recorder
from simulator.notices import Block, Near
from simulator.params import rule_for
from simulator.references import reference_for, trailing_bound
from simulator.rlqs import (
    FIRST,
    PERIODIC,
    Gateway,
    QuotaServer,
    RlqsPlan,
    RlqsStats,
    leave,
)
from simulator.scenarios import Setup
from simulator.traffic import Traffic
from simulator.variants import System

# Real timers wake a millisecond or two late; the jitter also shuffles which node pushes
# first at a shared span boundary, as in a real fleet (a fixed order would bias `seen`).
WAKE_JITTER_MS = 3
BOOT, LEAVE, SYNC, EXEC, APPLY, REPORT, NOTICE = range(7)
QuotaFactory = Callable[[], QuotaServer]
KEY = ("sim", "client", "c1")


class FlakyStore:
    """The shared `MemoryStorage`, raising while an outage is on (as the Redis store raises)."""

    def __init__(self, store: MemoryStorage, outages: tuple[tuple[int, int], ...], engine: Engine):
        self.store, self.outages, self.engine = store, outages, engine

    def execute(self, batch: SyncBatch, node_id: str) -> SyncResult:
        now = self.engine.now
        if any(a <= now < b for a, b in self.outages):
            raise StoreUnavailable("store unreachable")
        return self.store.execute(batch, node_id)


@dataclass
class SimNode:
    index: int
    limiter: Limiter
    fleet: FleetLimiter | None  # the same limiter, when it syncs with the shared store
    offset: int
    latency_ms: int
    hits: list[Hit]
    schedule: SyncSchedule
    serving: bool = True
    leaving: bool = False
    flushes: int = 0
    token: int = 0  # generation of the scheduled SYNC; stale wake-ups are ignored
    batch: SyncBatch | None = None  # the sync in flight
    answer: SyncResult | None = None
    timed_out: bool = False
    dropped: int = 0  # the limiter's dropped_hits already recorded
    tracking: bool = False  # has a key, hence span ends to wake for
    gateway: Gateway | None = None  # an RLQS gateway: its Envoy decides (rlqs.py)
    wake_ms: int = 0  # the planned sync, on the node's clock
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = f"node-{self.index}"


class Engine:
    def __init__(self, setup: Setup, system: System, quota: QuotaFactory | None = None) -> None:
        self.setup, self.system = setup, system
        p = setup.params
        self.now = setup.boot_ms
        shared = MemoryStorage(clock=lambda: self.now, node_ttl_ms=setup.node_ttl_ms)
        self.shared = FlakyStore(shared, setup.outages, self)
        self.nodes: dict[int, SimNode] = {}
        self.heap: list[tuple[int, int, int, int, object]] = []
        self.seq = 0
        self.recorder = Recorder(setup.start_ms, p.window_ms, p.spans, p.windows, p.max)
        self.recorder.allowance = p.cooldown + setup.slack_ms
        self.rule = setup.rule
        if not system.shared:  # local-only: each node enforces its share of the fleet's limit
            self.rule = rule_for(p, p.nodes)
        elif system.edge or system.strict:
            self.rule = with_consistency(self.rule, strict=system.strict)
        limit = setup.rule.limit
        assert limit is not None
        # The exact reference, run centrally on every arrival: it is the `exact` system, and
        # what every other system is measured against (metrics.py, trailing and versus).
        self.reference = reference_for(limit)
        self.recorder.algorithm, self.recorder.bound = p.algorithm.text, trailing_bound(limit)
        self.jitter = Random(p.seed + 1)  # its own stream: the offered traffic stays the same
        self.rlqs = RlqsPlan(system.rlqs, p.rlqs_gateways, setup.rlqs_outages)
        self.rlqs_stats = RlqsStats()
        self.quota = quota
        if system.rlqs and quota is None:
            from simulator.quota_server import SidecarQuota

            self.quota = SidecarQuota

    def run(self) -> Recorder:
        rng = Random(self.setup.params.seed)
        members = self.setup.membership
        traffic = Traffic(self.setup.schedule(rng), members, self.setup.start_ms, rng)
        if not self.system.central:
            for i in range(members.initial):
                self._at(self.setup.boot_ms, BOOT, i)
            for change in members.changes:
                self._at(change.at_ms, BOOT if change.joins else LEAVE, change.node)
        self._loop(traffic)
        return self.recorder

    def _loop(self, traffic: Traffic) -> None:
        end, heap = self.setup.end_ms, self.heap
        t_arr, node = traffic.next()
        while True:
            if heap and heap[0][0] <= t_arr:  # on a tie, syncs and membership go first
                t, _, kind, index, payload = heapq.heappop(heap)
                if t >= end:
                    return
                self.now = t
                self._dispatch(kind, index, payload)
                continue
            if t_arr >= end:
                return
            self.now = t_arr
            self._request(t_arr, node)
            t_arr, node = traffic.next()

    def _at(self, t: int, kind: int, index: int, payload: object = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, index, payload))

    def _request(self, t: int, index: int) -> None:
        exact = self.reference.hit(t)
        if self.system.central:
            ok = exact
            self.recorder.store_calls += 1  # a check on the store per request
        else:
            node = self.nodes[index]
            if node.gateway is not None:
                ok, first = node.gateway.admit(t)
                if first:  # a new bucket's first request sends a report at once
                    self._at(t, REPORT, index, FIRST)
            else:
                ok = node.limiter.hit(t + node.offset, node.hits).code is Code.OK
                self._early_push(node, t + node.offset)
            if not node.tracking:
                self._first_key(node)
        self.recorder.request(t, index, ok)
        self.recorder.versus(t, ok, exact)

    def _dispatch(self, kind: int, index: int, payload: object) -> None:
        if kind == BOOT:
            self._boot(index)
            return
        node = self.nodes.get(index)
        if node is None:
            return
        if kind == LEAVE:
            self._leave(node)
        elif kind == SYNC and payload == node.token and node.batch is None:
            self._sync(node)
        elif kind == EXEC and isinstance(payload, SyncBatch):
            self._exec(node, payload)
        elif kind == APPLY and payload is node.batch:
            self._apply(node)
        elif kind == REPORT and node.serving and node.gateway is not None:
            self._gateway(node, node.gateway, str(payload))
        elif kind == NOTICE and node.fleet is not None and isinstance(payload, Near | Block):
            notices.deliver(node.fleet, payload, self.now + node.offset, node.latency_ms // 2)
            self._early_push(node, self.now + node.offset)

    def _boot(self, index: int) -> None:
        setup, system = self.setup, self.system
        # Redis TIME as the span clock: every node reads the store's clock (half a round trip
        # compensated, as NTP does), so all nodes share the true clock.
        offset = 0 if system.store_clock else setup.offsets[index]
        if system.store_clock and system.raw_store_clock:  # read at the store, used on receipt
            offset = -(setup.latency_ms // 2)
        hits = [Hit(self.rule, KEY, 1)]
        schedule = SyncSchedule(self.now + offset, setup.params.timeout_ms)
        if not system.shared:  # local-only: decisions from memory, nothing to sync
            node = SimNode(index, LocalLimiter(), None, offset, 0, hits, schedule)
            self.nodes[index] = node
            return
        fleet = FleetLimiter(
            fixed_window=system.algorithm, new_keys_alone=system.new_keys_alone, key_digest=digest
        )
        node = SimNode(index, fleet, fleet, offset, setup.latency_ms, hits, schedule)
        self.nodes[index] = node
        if self.quota is not None and self.rlqs.uses_rlqs(index):
            node.gateway = Gateway(self.quota(), offset)
            self.rlqs_stats.gateways += 1
            # Envoy's report timer runs from its start, at its own phase.
            self._at(self.now + self.jitter.randrange(REPORT_PERIOD_MS), REPORT, index, PERIODIC)
        self._wake(node, self.now)  # the schedule's first sync is at once

    def _leave(self, node: SimNode) -> None:
        """SIGTERM: stop serving, then flush every pending hit (after any sync in flight)."""
        node.serving, node.leaving = False, True
        if node.gateway is not None:
            leave(node.gateway.envoy, self.rlqs_stats, self.now)
        if node.fleet is None:
            del self.nodes[node.index]  # nothing to flush
        elif node.batch is None:
            self._wake(node, self.now)

    def _wake(self, node: SimNode, t: int) -> None:
        node.token += 1
        node.wake_ms = t + node.offset
        self._at(t, SYNC, node.index, node.token)

    def _sync(self, node: SimNode) -> None:
        fleet = _fleet(node)
        batch = fleet.end_span(self.now + node.offset, flush=node.leaving)
        node.batch, node.answer = batch, None
        latency = node.latency_ms
        if latency == 0:
            self._exec(node, batch)
            self._apply(node)
            return
        keys = len(batch.pushes) + len(batch.total_reads)
        timeout = node.schedule.store_timeout_ms(fleet.shortest_span_ms(), keys)
        node.timed_out = latency > timeout
        self._at(self.now + latency // 2, EXEC, node.index, batch)
        self._at(self.now + min(latency, timeout), APPLY, node.index, batch)

    def _exec(self, node: SimNode, batch: SyncBatch) -> None:
        """The store applies the batch whether or not the node is still waiting for it."""
        try:
            answer: SyncResult | None = self.shared.execute(batch, node.name)
        except StoreError:
            answer = None
        self.recorder.store_calls += len(batch.pushes) + len(batch.total_reads)
        if batch is node.batch and not node.timed_out:
            node.answer = answer
        for notice in notices.announced(batch, answer) if answer is not None else ():
            for other in self.nodes.values():
                self._at(self.now + other.latency_ms // 2, NOTICE, other.index, notice)

    def _apply(self, node: SimNode) -> None:
        fleet, batch, answer = _fleet(node), node.batch, node.answer
        assert batch is not None
        node.batch = node.answer = None
        # As the sync loop: a refused call surely did not arrive (resend); a timed-out one may.
        resend = not node.timed_out
        fleet.apply_sync(self.now + node.offset, batch, answer, resend)
        self.recorder.dropped_hits += fleet.dropped_hits - node.dropped
        node.dropped = fleet.dropped_hits
        if answer is not None and node.serving:
            self._sample_nodes(node)
        if node.leaving:
            self._after_flush(node)
            return
        now = self.now + node.offset
        node.schedule.synced(now)
        self._plan_wake(node, now)

    def _plan_wake(self, node: SimNode, now: int) -> None:
        span_end = node.limiter.next_span_end(now)
        node.tracking = span_end is not None
        wake = node.schedule.next_sync(span_end)
        # A span end already passed (a push between span ends may end after one) is due now.
        at = max(wake - node.offset, self.now)
        self._wake(node, at + self.jitter.randrange(WAKE_JITTER_MS))

    def _early_push(self, node: SimNode, now: int) -> None:
        """A key asked for a push before the planned wake-up: the sync loop is woken for it."""
        fleet = node.fleet
        if fleet is None or node.batch is not None:
            return
        due = fleet.early.due_ms
        if due is not None and due < node.wake_ms:
            self._plan_wake(node, now)

    def _first_key(self, node: SimNode) -> None:
        """The sync loop's poll notices a newly active rule; re-plan the wake-up."""
        if node.fleet is None:
            node.tracking = True  # a local node has no wake-up to plan
        elif node.batch is None and node.limiter.next_span_end(self.now + node.offset) is not None:
            self._plan_wake(node, self.now + node.offset)

    def _after_flush(self, node: SimNode) -> None:
        fleet = _fleet(node)
        node.flushes += 1
        if fleet.pending_hits() == 0 or node.flushes >= FLUSH_ATTEMPTS:
            self.recorder.dropped_hits += fleet.pending_hits()
            del self.nodes[node.index]
        else:
            self._wake(node, self.now)

    def _gateway(self, node: SimNode, gateway: Gateway, kind: str) -> None:
        lost = self.rlqs_stats.lost_hits
        served = (node.limiter, node.hits)
        for at, what in gateway.handle(kind, self.now, served, self.rlqs, self.rlqs_stats):
            self._at(at, REPORT, node.index, what)
        self.recorder.dropped_hits += self.rlqs_stats.lost_hits - lost
        if not node.tracking:
            self._first_key(node)
        self._early_push(node, self.now + node.offset)  # a lease asks for its push at once

    def _sample_nodes(self, node: SimNode) -> None:
        truth = self.setup.membership.inverse_share(node.index, self.now)
        for state in node.limiter.keys:
            if self.system.oracle_nodes:
                state.nodes.set(truth)
            self.recorder.nodes_sample(state.nodes.value, truth)


def with_consistency(rule: Rule, *, strict: bool) -> Rule:
    """`rule` with `consistency: edge`, or `strict`."""
    assert rule.limit is not None
    limit = replace(rule.limit, edge=not strict, strict=strict)
    return replace(rule, limit=limit, limits=(limit,))


def _fleet(node: SimNode) -> FleetLimiter:
    """The limiter of a node that syncs (local nodes schedule no sync events)."""
    assert node.fleet is not None
    return node.fleet

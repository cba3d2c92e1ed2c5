"""Counts shared by a fleet through a store: what a span end sends, and what its answer does.

At a key's span end, `end_span` hands its hits to the store and asks for the finished window's
total where the nodes estimate needs it; the sync loop sends the batch and calls `apply_sync`
with the answer, or None if the store failed. Which keys are synced: core/quiet_keys.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit
from ratelimit_sidecar.core.fixed_window import FixedWindow
from ratelimit_sidecar.core.keystate import KeyState, WindowCounts
from ratelimit_sidecar.core.limiter import DEFAULT_MAX_KEYS, KEYS_PER_STEP, Limiter, lifts_block
from ratelimit_sidecar.core.quiet_keys import QUIET_SHARE, EarlySync, HeardTotals, QuietKeys
from ratelimit_sidecar.core.sliding_window import SlidingWindow
from ratelimit_sidecar.core.spancounts import SpanState
from ratelimit_sidecar.core.spans import span_bounds, span_end, span_index, span_number
from ratelimit_sidecar.core.syncplan import SyncPlan
from ratelimit_sidecar.core.token_bucket import TokenBucket
from ratelimit_sidecar.core.types import KeyId, Push, SyncBatch, SyncResult, SyncStats, TotalRead


class FleetLimiter(Limiter):
    def __init__(
        self,
        max_keys: int = DEFAULT_MAX_KEYS,
        *,
        fixed_window: FixedWindow | None = None,
        quiet_share: float = QUIET_SHARE,
        new_keys_alone: bool = True,
        key_digest: Callable[[KeyId], str] | None = None,
    ) -> None:
        """`key_digest` names a key as the store's near notices do (None: not followed)."""
        self.early = EarlySync()
        fixed_window = replace(fixed_window or FixedWindow(), early=self.early)
        sliding_window = SlidingWindow(early=self.early)
        super().__init__(
            max_keys,
            fixed_window=fixed_window,
            sliding_window=sliding_window,
            token_bucket=TokenBucket(early=self.early),
        )
        self.fixed_window = fixed_window
        self.sliding_window = sliding_window
        self._orphans: list[Push] = []  # unpushed hits of keys that left the table
        self._plan: SyncPlan | None = None
        self.new_keys_alone = new_keys_alone
        self.heard = HeardTotals(key_digest)
        self.quiet = QuietKeys(quiet_share, self.early, self.heard)
        self._swept_ms = -1  # when a sync last looked at every key

    @property
    def store_up(self) -> bool:
        """The last sync was answered."""
        return self.early.store_up

    @store_up.setter
    def store_up(self, up: bool) -> None:
        self.early.store_up = up

    @property
    def live_nodes(self) -> int:
        """From the heartbeats; the fixed window's early share needs it."""
        return self.early.live_nodes

    @live_nodes.setter
    def live_nodes(self, nodes: int) -> None:
        self.early.live_nodes = nodes

    def _new_key_nodes(self, limit: RateLimit, alone: bool) -> float:
        """A fixed-window key of a request assumes its gateway alone (core/quiet_keys.py)."""
        fixed = limit.algorithm is AlgorithmName.FIXED_WINDOW
        alone = alone and fixed and self.new_keys_alone and self.store_up
        return 1 if alone else self.live_nodes

    def _started(self, state: KeyState) -> None:
        state.nodes.live = self.live_nodes  # what its first guess knew (`NodesEstimate.grow`)
        self.quiet.start_key(state)

    def _catch_up(self, state: KeyState, now_ms: int) -> None:
        """The sync loop pushes the ended span; only the window may have moved on."""
        self.dropped_hits += self.quiet.roll(state, now_ms)

    def apply_near(  # noqa: PLR0917 - a notice's fields, as the store sends them
        self,
        key: KeyId | None,
        digest: str,
        window: int,
        total: int,
        now_ms: int,
        edge: bool = False,
    ) -> None:
        """A near notice (core/quiet_keys.py), or a push at the edge (core/edge.py); an untracked
        key's total waits for its request."""
        state = None if key is None else self.keys.get(key)
        if state is None:
            self.heard.put(digest, window, total, now_ms if edge else -1)
        elif edge:
            self.quiet.edge_announced(state, window, total, now_ms)
        else:
            self.quiet.announced(state, window, total, now_ms)

    def _count_late(self, state: KeyState, hits: int) -> None:
        """Pushed with the previous window's last span, and counted in its own count (`nodes`)."""
        self.dropped_hits += state.stash(hits, state.window - 1, state.window)
        nodes = state.nodes
        if nodes.window == state.window - 1:
            nodes.window_admitted += hits

    def _evicted(self, state: KeyState) -> None:
        """Eviction loses precision, never counts: unpushed hits go out (a quiet key's do not)."""
        self.quiet.forget_held(state, state.last_hit)
        for count, window in ((state.unsent, state.unsent_window), (state.pending, state.window)):
            if count:
                self._orphans.append(Push(state.key, window, count, state.limit))
        state.unsent = state.pending = 0

    def end_span(self, now_ms: int, flush: bool = False) -> SyncBatch:
        for _ in self.end_span_steps(now_ms, flush):
            pass
        return self.batch_in_flight()

    def end_span_steps(
        self, now_ms: int, flush: bool = False, keys_per_step: int = KEYS_PER_STEP
    ) -> Iterator[int]:
        """In slices, so an event loop answers requests in between (hits meanwhile are safe)."""
        if self._plan is not None:
            raise RuntimeError("end_span called while a sync is still in flight")
        plan = self._plan = SyncPlan(now_ms, self.algorithms)
        asked = _still_tracked(self.early.states)
        self.early.states, self.early.due_ms = [], None
        for orphan in self._orphans:
            plan.push(None, orphan)
        self._orphans = []
        keys: Iterable[KeyState] = self.keys
        waiting = [] if flush else [state for state in asked if now_ms < state.next_sync]
        if not (flush or self._span_ended(now_ms)):  # only the keys that asked (core/edge.py)
            keys = asked
        else:
            self._swept_ms = now_ms
        for index, state in enumerate(keys):
            if flush or now_ms >= state.next_sync:
                self._plan_key(plan, state, now_ms, flush)
            if index % keys_per_step == keys_per_step - 1:
                yield index + 1
        for state in waiting:  # asked for a later push: still asks
            self.early.want(state.next_sync, state, wake=False)

    def _span_ended(self, now_ms: int) -> bool:
        """A span of some rule ended since the last sync that looked at every key."""
        ended = super().next_span_end(self._swept_ms)
        return ended is None or now_ms >= ended

    def next_span_end(self, now_ms: int) -> int | None:
        """The first span end since the last sync that looked at every key (a push between span
        ends may end after one), or an early push's."""
        swept = self._swept_ms if self._swept_ms >= 0 else now_ms
        ends = (super().next_span_end(swept), self.early.due_ms)
        return min((end for end in ends if end is not None), default=None)

    def batch_in_flight(self) -> SyncBatch:
        if self._plan is None:
            raise RuntimeError("no sync in flight")
        return self._plan.batch

    def _plan_key(self, plan: SyncPlan, state: KeyState, now_ms: int, flush: bool) -> None:
        self.dropped_hits += self.quiet.roll(state, now_ms)
        self.quiet.expire(state, now_ms)
        limit = state.limit
        ended, state.next_sync = state.next_sync, span_end(now_ms, limit.window_ms, limit.spans)
        if state.idle(now_ms):
            self.keys.remove(state)
            return
        self._move_leased(plan, state, now_ms)
        retried = self._plan_unsent(plan, state, now_ms) if state.unsent else False
        counts = state.counts
        fixed = counts if not flush and isinstance(counts, WindowCounts) else None
        held = not flush and self.quiet.quiet(state, now_ms)
        blocked = (
            fixed is not None and not state.pending and self.quiet.blocked_alone(state, now_ms)
        )
        if blocked:
            self.fixed_window.rearm(state, now_ms)
        # A key whose hits are being retried for the window just ended gets its flag back from
        # that push: one push per key and span either way.
        if not (held or blocked) and (state.pending or not retried):
            span = push_span(state, ended, now_ms)
            levels = _levels(state, now_ms)
            window_counts = counts if isinstance(counts, WindowCounts) else None
            alone = window_counts is not None and window_counts.alone and state.nodes.value == 1
            edge = window_counts.edge if window_counts is not None else asked(state, ended)
            push = Push(state.key, state.window, state.pending, limit, span, *levels, alone, edge)
            plan.push(state, push)
            state.inflight, state.pending = state.pending, 0
            self.quiet.pushed(state, now_ms)
        first_span_over = span_index(now_ms, limit.window_ms, limit.spans) >= 1
        if state.nodes.window >= 0 and first_span_over:
            plan.read_total(state, TotalRead(state.key, state.nodes.window))

    def _move_leased(self, plan: SyncPlan, state: KeyState, now_ms: int) -> None:
        """A trailing window's leased tokens moved to the current span (core/spancounts.py,
        `LeasedSpans`), pushed first in the round trip: the key's answer counts them, and no
        reader sees them gone from one span and not yet in the other."""
        if not isinstance(state.counts, SpanState):
            return
        limit = state.limit
        for span, hits in self.sliding_window.move_leased(state, now_ms):
            window = span // limit.spans
            plan.push(None, Push(state.key, window, hits, limit, span, edge=True))

    def _plan_unsent(self, plan: SyncPlan, state: KeyState, now_ms: int) -> bool:
        """True if pushed (else dropped), never in a span before they were counted."""
        pushed = state.window - state.unsent_window <= 1
        if pushed:
            limit = state.limit
            last_of_window = (state.unsent_window + 1) * limit.spans - 1
            span = min(span_number(now_ms - 1, limit), last_of_window)
            retry = Push(state.key, state.unsent_window, state.unsent, limit, span)
            plan.push(state, retry, fresh=False)
        else:
            self.dropped_hits += state.unsent
        state.unsent = 0
        return pushed

    def apply_sync(
        self, now_ms: int, batch: SyncBatch, result: SyncResult | None, resend: bool = True
    ) -> SyncStats:
        """The store's answer, or None: the fallback. `resend`: the failed pushes surely did not
        arrive (refused, not timed out), so a retry cannot count them twice."""
        plan = self._plan
        if plan is None or plan.batch is not batch:
            raise RuntimeError("apply_sync for a batch that is not in flight")
        self._plan = None
        if result is not None and not plan.answers(result):
            result, resend = None, False  # a store that answers something else: maybe applied
        if batch:  # an empty batch is not sent: it says nothing of the store
            self.store_up = result is not None
        if result is None:
            stats = plan.fail(now_ms, resend)
        else:
            if result.live_nodes > 0:
                self.live_nodes, self.quiet.nodes_known = result.live_nodes, True
            stats = plan.succeed(now_ms, result)
            if result.heartbeat_error:
                stats = replace(stats, heartbeat_failed=True)
        self._orphans += plan.requeue
        self._orphan_unsent_of_gone(plan)
        self.dropped_hits += stats.dropped_hits
        return stats

    def _orphan_unsent_of_gone(self, plan: SyncPlan) -> None:
        """A key evicted during its push got its failed count back where no span end looks."""
        for state in plan.states():
            if state.unsent and self.keys.get(state.key) is not state:
                self._orphans.append(
                    Push(state.key, state.unsent_window, state.unsent, state.limit)
                )
                state.unsent = 0

    def apply_block(
        self, key: KeyId, left_ms: int, now_ms: int, level: int = 0, set_for: int = 0
    ) -> bool:
        """As if the next sync had found it; True if it blocks longer. Not for an untracked key (its
        first push reads the flag), nor a limit raised above the block's `set_for`."""
        state = self.keys.get(key)
        if state is None or left_ms <= 0 or now_ms + left_ms <= state.blocked_until:
            return False
        if lifts_block(set_for, state.limit):
            return False
        if state.penalty is not None:  # the block's level, so that its offences raise it
            state.penalty.take_block(now_ms, level, left_ms)
        state.block(now_ms + left_ms)
        return True

    def pending_hits(self) -> int:
        """What a shutdown flush must push."""
        tracked = sum(s.pending + s.inflight + s.unsent for s in self.keys)
        return tracked + sum(p.hits for p in self._orphans)


def _still_tracked(states: list[KeyState]) -> list[KeyState]:
    """Each state once, if the table still holds it."""
    unique = {id(state): state for state in states if state.tracked}
    return list(unique.values())


def _levels(state: KeyState, now_ms: int) -> tuple[int, int]:
    """The level an offence asks for (0: none), and this node's running block's (-1: none)."""
    penalty = state.penalty
    if penalty is None:
        return 0, -1
    blocking = penalty.block_level if now_ms < state.blocked_until else -1
    return penalty.wanted, blocking


def push_span(state: KeyState, ended_ms: int, now_ms: int) -> int:
    """The span a push's hits are counted in (a read alone: the latest): the last hit's (they stay
    in a trailing window longer, never shorter), but for a sync running late into the span after
    `ended_ms`: the span that ended. Else one hit counted before the late sync moved all a span
    later, and with the pushed span's floor a node counted them twice, refusing a sliding window
    under MAX. Not in a window's first span: the ended window has its own push."""
    limit = state.limit
    if isinstance(state.counts, SpanState) and state.counts.leased is not None:
        return _leased_push_span(state, now_ms)
    if not state.pending:
        return span_number(now_ms - 1, limit)
    span = span_number(state.last_hit, limit)
    late = ended_ms <= state.last_hit and span_number(ended_ms, limit) == span
    # An early push's due time (core/edge.py) ends no span: its hits are the span's own.
    late = late and is_span_end(ended_ms, limit)
    return span - 1 if late and span % limit.spans else span


def _leased_push_span(state: KeyState, now_ms: int) -> int:
    """A leased trailing window's (core/spancounts.py, `LeasedSpans`): its leases in the span
    they were counted in, as `LeasedSpans` places them, and a read of the span now, where the
    leases move at each sync. Read in the span before at a span's first ms, a node missed the
    others' moved leases (simulator, a store answering at once: 273 of 240 in a trailing
    window at twice MAX; 240 after); pushed a span early, a given-back lease stayed there."""
    return span_number(state.last_hit if state.pending else now_ms, state.limit)


def asked(state: KeyState, ended_ms: int) -> bool:
    """A sliding window's or bucket's push at the edge between span ends (core/edge.py): its
    store work is the edge's."""
    return state.edge and not is_span_end(ended_ms, state.limit)


def is_span_end(ms: int, limit: RateLimit) -> bool:
    """`ms` is the first of a span: a span end's sync, not an early push's due time."""
    return span_bounds(span_number(ms, limit), limit)[0] == ms

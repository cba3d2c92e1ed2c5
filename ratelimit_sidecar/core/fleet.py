"""Counts shared by a fleet through a store: what a span end sends, and what its answer does.

At each span end of a key, `end_span` hands its hits to the store (INCRBY into the window's
counter) and asks for the finished window's total where the nodes estimate needs it; the sync
loop sends the batch and calls `apply_sync` with the answer, or with None if the store failed.
How much a key is synced follows how near its limit it is (core/quiet_keys.py): a key near it
is pushed every span, even with nothing to add, since the answer carries the window's global
total and block flag; a quiet one costs the store nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core.algorithms import shared_algorithms
from ratelimit_sidecar.core.fixed_window import FixedWindow
from ratelimit_sidecar.core.keystate import KeyState, WindowCounts
from ratelimit_sidecar.core.limiter import (
    DEFAULT_MAX_KEYS,
    KEYS_PER_STEP,
    Limiter,
    lifts_block,
)
from ratelimit_sidecar.core.quiet_keys import (
    QUIET_SHARE,
    EarlySync,
    HeardTotals,
    QuietKeys,
    new_key_nodes,
)
from ratelimit_sidecar.core.spans import span_end, span_index, span_number
from ratelimit_sidecar.core.syncplan import SyncPlan
from ratelimit_sidecar.core.types import (
    KeyId,
    Push,
    SyncBatch,
    SyncResult,
    SyncStats,
    TotalRead,
)


class FleetLimiter(Limiter):
    """A limiter whose counts go to a store shared by every node."""

    def __init__(
        self,
        max_keys: int = DEFAULT_MAX_KEYS,
        *,
        fixed_window: FixedWindow | None = None,
        quiet_share: float = QUIET_SHARE,
        new_keys_alone: bool = True,
        key_digest: Callable[[KeyId], str] | None = None,
    ) -> None:
        """`quiet_share`: the bound on held hits (core/quiet_keys.py; 0: none); see
        `_new_key_nodes` for `new_keys_alone`; `key_digest` names a key as the store's near
        notices do (None: not followed)."""
        self._shared_early = EarlySync()
        fixed_window = replace(fixed_window or FixedWindow(), early=self._shared_early)
        super().__init__(max_keys, fixed_window=fixed_window)
        # A store sums span totals and cannot merge logs: the configuration keeps a sliding
        # log off a shared store (core/sliding_log.py), so it has no entry here.
        self._shared = shared_algorithms(fixed_window)
        self._orphans: list[Push] = []  # unpushed hits of keys that left the table
        self._plan: SyncPlan | None = None
        self.new_keys_alone = new_keys_alone
        self.early = self._shared_early
        self.heard = HeardTotals(key_digest)
        self.quiet = QuietKeys(quiet_share, self.early, self.heard)
        self.store_up = True  # the last sync was answered

    @property
    def live_nodes(self) -> int:
        """The fleet's live node count (heartbeats); the fixed window's early share needs it."""
        return self._shared_early.live_nodes

    @live_nodes.setter
    def live_nodes(self, nodes: int) -> None:
        self._shared_early.live_nodes = nodes

    def _new_key_nodes(self, limit: RateLimit, alone: bool) -> float:
        alone = alone and self.new_keys_alone
        return new_key_nodes(limit, alone, self.store_up, self.live_nodes)

    def _started(self, state: KeyState) -> None:
        self.quiet.start_key(state)

    def _catch_up(self, state: KeyState, now_ms: int) -> None:
        """The sync loop pushes the span that ended; only the window may have moved on."""
        self.dropped_hits += self.quiet.roll(state, now_ms)

    def apply_near(self, key: KeyId, window: int, total: int) -> bool:
        """A near notice: another node's push took `key`'s `window` to `total`
        (core/quiet_keys.py). True if the key is tracked."""
        state = self.keys.get(key)
        if state is not None:
            self.quiet.announced(state, window, total)
        return state is not None

    def _count_late(self, state: KeyState, hits: int) -> None:
        """Pushed with the previous window's last span (the store counts it there), and this
        node's own count of that window, which `nodes` is learnt against, takes them too."""
        self.dropped_hits += state.stash(hits, state.window - 1, state.window)
        nodes = state.nodes
        if nodes.window == state.window - 1:
            nodes.window_admitted += hits

    def _evicted(self, state: KeyState) -> None:
        """Eviction loses tracking precision, never counts: its unpushed hits still go out,
        except a quiet key's (no push ever needed them)."""
        self.quiet.forget_held(state, state.last_hit)
        for count, window in ((state.unsent, state.unsent_window), (state.pending, state.window)):
            if count:
                self._orphans.append(Push(state.key, window, count, state.limit))
        state.unsent = state.pending = 0

    def end_span(self, now_ms: int, flush: bool = False) -> SyncBatch:
        """Hand every key whose span ended (every key, with `flush`) to the store."""
        for _ in self.end_span_steps(now_ms, flush):
            pass
        return self.batch_in_flight()

    def end_span_steps(
        self, now_ms: int, flush: bool = False, keys_per_step: int = KEYS_PER_STEP
    ) -> Iterator[int]:
        """`end_span` in slices, yielding after every `keys_per_step` keys.

        A caller on an event loop resumes requests between slices, so planning 100k keys never
        stalls decisions. Hits that arrive meanwhile are safe either way: a key not yet planned
        includes them in this push, a key already planned keeps them for its next span.
        When the iterator is exhausted, `batch_in_flight()` is the batch.
        """
        if self._plan is not None:
            raise RuntimeError("end_span called while a sync is still in flight")
        plan = self._plan = SyncPlan(now_ms, self._shared)
        self.early.due_ms = None
        plan.add_orphans(self._orphans)
        self._orphans = []
        for index, state in enumerate(self.keys):
            if flush or now_ms >= state.next_sync:
                self._plan_key(plan, state, now_ms, flush)
            if index % keys_per_step == keys_per_step - 1:
                yield index + 1

    def next_span_end(self, now_ms: int) -> int | None:
        """The next span end, or sooner an early push a new key asked for."""
        ends = (super().next_span_end(now_ms), self.early.due_ms)
        return min((end for end in ends if end is not None), default=None)

    def batch_in_flight(self) -> SyncBatch:
        if self._plan is None:
            raise RuntimeError("no sync in flight")
        return self._plan.batch

    def _plan_key(self, plan: SyncPlan, state: KeyState, now_ms: int, flush: bool) -> None:
        self.dropped_hits += self.quiet.roll(state, now_ms)
        limit = state.limit
        ended, state.next_sync = state.next_sync, span_end(now_ms, limit.window_ms, limit.spans)
        if state.idle(now_ms):
            self.keys.remove(state)
            return
        retried = self._plan_unsent(plan, state, now_ms) if state.unsent else False
        counts = state.counts
        held = (
            not flush
            and isinstance(counts, WindowCounts)
            and self.quiet.quiet(state, counts, now_ms)
        )
        # A key whose last span's hits are being pushed for the window that just ended (they
        # were counted after it closed) already gets its flag back from that push: one push
        # per key and span either way.
        if not held and (state.pending or not retried):
            span = push_span(state, ended, now_ms)
            levels = _levels(state, now_ms)
            push = Push(state.key, state.window, state.pending, limit, span, *levels)
            plan.push(state, push)
            state.inflight, state.pending = state.pending, 0
            self.quiet.pushed(state)
        first_span_over = span_index(now_ms, limit.window_ms, limit.spans) >= 1
        if state.nodes.window >= 0 and first_span_over:
            plan.read_total(state, TotalRead(state.key, state.nodes.window))

    def _plan_unsent(self, plan: SyncPlan, state: KeyState, now_ms: int) -> bool:
        """Push hits left from an earlier span (or count them dropped); True if pushed.

        Their span is the one that just ended, or the last of their window if that ended
        before: never earlier than they were counted, so they never leave a trailing window
        too soon."""
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
        """Apply the store's answer to `batch`, or the fallback if `result` is None.

        After a failure, `resend` says whether the pushes may be sent again: True when they
        surely did not arrive (connection refused), False when they may have been applied
        (a timeout), so that a retry can never count the same hits twice.
        """
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
        """A key evicted while its push was in flight got that push's failed count back in its
        state, which no span end visits any more: send it as an orphan instead."""
        for state in plan.states():
            if state.unsent and self.keys.get(state.key) is not state:
                self._orphans.append(
                    Push(state.key, state.unsent_window, state.unsent, state.limit)
                )
                state.unsent = 0

    def apply_block(
        self, key: KeyId, left_ms: int, now_ms: int, level: int = 0, set_for: int = 0
    ) -> bool:
        """A block the store started for `key` (another node's push crossed MAX, or a strict
        refusal), announced at once instead of found by this node's next sync: the key refuses
        until `now_ms + left_ms`, as if that sync had answered it. True if it blocks the key
        longer than it was; an untracked key is left alone (its first push reads the flag), and
        so is a key whose limit is above the `set_for` the block was started for (a node that
        had not seen a raise yet started it: `lifts_block`)."""
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
        """Admitted hits not yet confirmed by the store (what a shutdown flush must push)."""
        tracked = sum(s.pending + s.inflight + s.unsent for s in self.keys)
        return tracked + sum(p.hits for p in self._orphans)


def _levels(state: KeyState, now_ms: int) -> tuple[int, int]:
    """What a push reports of the key's penalty: the level an offence asks for (0: none), and
    the level of this node's running block (-1: none; core/penalty.py flag_level)."""
    penalty = state.penalty
    if penalty is None:
        return 0, -1
    blocking = penalty.block_level if now_ms < state.blocked_until else -1
    return penalty.wanted, blocking


def push_span(state: KeyState, ended_ms: int, now_ms: int) -> int:
    """The span a push's hits are counted in at the store; a read alone asks for the latest.

    Hits go in the span of the last one (a later span than some of them: they stay in a
    trailing window longer, never shorter), except when a sync runs late, in the span after the
    end `ended_ms` it is for: then the span that ended. Otherwise one hit counted before the
    late sync moved all the span's hits a span later, and (with the floor of the pushed span)
    a node counted them twice for a span, refusing a sliding window's requests under MAX when
    syncs ran late. The hits counted in those few ms are a span early instead. Not in a
    window's first span: the ended window's hits have their own push.
    """
    limit = state.limit
    if not state.pending:
        return span_number(now_ms - 1, limit)
    span = span_number(state.last_hit, limit)
    late = ended_ms <= state.last_hit and span_number(ended_ms, limit) == span
    return span - 1 if late and span % limit.spans else span

"""The limiter core: decides requests from memory and turns span ends into store batches.

Pure and synchronous: no I/O, no clock of its own. Callers pass `now_ms` (wall-clock epoch
milliseconds; nodes share windows by epoch ordinal) to every call:

* `hit(now_ms, hits) -> Decision` on the request path;
* `end_span(now_ms) -> SyncBatch` when a span boundary passes, then, after the store answered,
  `apply_sync(now_ms, batch, result)`, or `apply_sync(now_ms, batch, None)` if it failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core.keystate import NO_WINDOW, KeyState
from ratelimit_sidecar.core.keytable import KeyTable
from ratelimit_sidecar.core.spans import span_end, span_index, window_end
from ratelimit_sidecar.core.syncplan import SyncPlan
from ratelimit_sidecar.core.types import (
    Code,
    Decision,
    Hit,
    Push,
    SyncBatch,
    SyncResult,
    SyncStats,
    TotalRead,
    Verdict,
)

# A Verdict from a tuple of all its fields, without the NamedTuple's own __new__ (a Python
# function call): `_within` builds one for every admitted request.
_verdict: Callable[[tuple[object, ...]], Verdict] = partial(tuple.__new__, Verdict)
UNMATCHED = Verdict(Code.OK)
UNLIMITED = Verdict(Code.OK, unlimited=True)
DEFAULT_MAX_KEYS = 100_000
NEAR_LIMIT_RATIO = 0.8
KEYS_PER_STEP = 2000  # keys planned between two yields of end_span_steps
# With a private store a key costs only memory (bounded by max_keys), so it is kept through a
# minute of silence (or two windows, if longer): a returning client finds its counter instead of
# making a new one. A sweep every quarter of that forgets the idle ones.
LOCAL_IDLE_MS = 60_000
LOCAL_SWEEP_MS = LOCAL_IDLE_MS // 4


class Limiter:
    """Decisions and span bookkeeping for every key this node tracks."""

    def __init__(
        self, max_keys: int = DEFAULT_MAX_KEYS, shadow_mode: bool = False, shared_store: bool = True
    ) -> None:
        self.keys = KeyTable(max_keys)
        self.shadow_mode = shadow_mode
        # With a shared store every active key is pushed each span, even with nothing to add:
        # the answer brings other nodes' totals and block flags. A store this node owns alone
        # (local-only mode) would only echo the node's own counts, so they are applied here at
        # each span end and nothing is pushed (see _fold).
        self.shared_store = shared_store
        self.live_nodes = 1  # node-level estimate for keys without history
        self.dropped_hits = 0  # admitted hits that could never be pushed (cumulative)
        self.untracked = 0  # decisions made without a counter: the table was full of blocks
        self._schedules: set[tuple[int, int]] = set()
        self._orphans: list[Push] = []  # unpushed hits of evicted keys
        self._plan: SyncPlan | None = None
        # With a private store a span end has no work per key (see _catch_up); every key is
        # looked at only by a periodic sweep that forgets idle ones.
        self._next_sweep = 0

    # -- request path -------------------------------------------------------------------

    def hit(self, now_ms: int, hits: Sequence[Hit]) -> Decision:
        """Decide a request; counters move only if every descriptor admits it."""
        if len(hits) == 1:
            return self._hit_one(now_ms, hits[0])
        # A request of one counted descriptor among others no limit applies to (Envoy's usual
        # shape) reaches `admit` from the handler, which knows which one it is.
        return self._hit_all(now_ms, hits)

    def _hit_all(self, now_ms: int, hits: Sequence[Hit]) -> Decision:
        checked = [self._check(now_ms, hit) for hit in hits]
        over = any(verdict.code is Code.OVER_LIMIT for verdict, _ in checked)
        if not over:
            for (_, state), hit in zip(checked, hits, strict=True):
                if state is not None and hit.hits:
                    self._admit(state, hit.hits, now_ms)
        verdicts = tuple(self._finish(verdict, state, now_ms) for verdict, state in checked)
        return Decision(Code.OVER_LIMIT if over else Code.OK, verdicts)

    def _hit_one(self, now_ms: int, hit: Hit) -> Decision:
        verdict = self.admit(now_ms, hit)
        if verdict is None:
            return self._hit_all(now_ms, (hit,))
        return Decision(Code.OK, (verdict,))

    def admit(self, now_ms: int, hit: Hit) -> Verdict | None:
        """The usual descriptor: a key whose limit admits it. Counts it, returns OK.

        Returns None, counting nothing, for anything else (a block, a rejection, no limit, a
        reloaded rule, a full key table): `hit` decides those, so the rules live in one place.
        A caller with a request of one counted descriptor may try this first, then `hit`.
        """
        state = self.keys.get(hit.key)
        if state is None:
            state = self._first_sight(hit, now_ms)
            if state is None:
                return None
        elif hit.rule is None or state.limit is not hit.rule.limit:
            return None
        if now_ms >= state.next_sync:
            self._catch_up(state, now_ms)
        hits, seen, unpushed = hit.hits, state.seen, state.inflight + state.pending
        # KeyState.over, inlined: the estimate passes its ceiling, or the known count MAX.
        over = hits > 0 and (
            seen + (unpushed + hits) * state.check_nodes > state.ceiling
            or seen + unpushed + hits > state.limit.requests_per_unit
        )
        if over or now_ms < state.blocked_until:
            return None
        if hits:  # _admit, inlined: this runs for every admitted request
            state.pending += hits
            local = state.local_cur + hits
            state.local_cur = local if local > 0 else 0
            state.last_hit = now_ms
        return self._within(state, now_ms)

    def _first_sight(self, hit: Hit, now_ms: int) -> KeyState | None:
        """A new key for `admit`: only under a limit that admits something. None also when the
        table is full of blocked keys: deciding untracked is the general path's business."""
        rule = hit.rule
        if rule is None or rule.limit is None or rule.limit.requests_per_unit == 0:
            return None
        return self._state(hit, rule.limit, rule.shadow_mode or self.shadow_mode, now_ms)

    def _check(self, now_ms: int, hit: Hit) -> tuple[Verdict, KeyState | None]:
        rule = hit.rule
        if rule is None or rule.limit is None:
            return unlimited_verdict(hit), None
        shadow = rule.shadow_mode or self.shadow_mode
        limit = rule.limit
        if limit.requests_per_unit == 0:
            return self._deny(limit, hit.hits, shadow), None
        state = self._state(hit, limit, shadow, now_ms)
        if state is None:  # table full of blocked keys: decide on this request alone
            self.untracked += 1
            return self._untracked(limit, hit.hits, shadow, now_ms), None
        return self._judge(state, hit.hits, now_ms), state

    def _judge(self, state: KeyState, hits: int, now_ms: int) -> Verdict:
        if now_ms >= state.next_sync:
            self._catch_up(state, now_ms)
        limit = state.limit
        if now_ms < state.blocked_until:
            return self._over(state, now_ms)
        if hits > 0 and state.over(hits):
            return self._estimate_over(state, hits, now_ms)
        return Verdict(Code.OK, limit)  # remaining/reset filled in once admitted

    def _estimate_over(self, state: KeyState, hits: int, now_ms: int) -> Verdict:
        """Step 2: the fleet's estimated count would pass MAX with this request's hits.

        Only a count known to be over (the store's total plus this node's own unpushed hits,
        which no guess about other nodes inflates) starts the cooldown. An estimate over MAX
        rejects this request alone: a noisy estimate must not block a key for a whole cooldown
        under the limit (docs/ACCURACY.md, decision (d)). The next sync refreshes the estimate,
        so that is when such a rejected client should retry.
        """
        limit = state.limit
        if state.seen + state.inflight + state.pending + hits > limit.requests_per_unit:
            state.block(now_ms + limit.cooldown)
            return self._over(state, now_ms)
        state.rejected += hits  # offered here: keeps `nodes` honest (see _estimate_nodes)
        shadow = state.shadow
        code = Code.OK if shadow else Code.OVER_LIMIT
        reset = span_end(now_ms, limit.window_ms, limit.spans) - now_ms
        return Verdict(code, limit, reset_ms=reset, shadowed=shadow, shadow=shadow)

    def _over(self, state: KeyState, now_ms: int) -> Verdict:
        code = Code.OK if state.shadow else Code.OVER_LIMIT
        reset = state.blocked_until - now_ms
        shadow = state.shadow
        return Verdict(code, state.limit, reset_ms=reset, shadowed=shadow, shadow=shadow)

    def _deny(self, limit: RateLimit, hits: int, shadow: bool) -> Verdict:
        code = Code.OK if shadow or hits <= 0 else Code.OVER_LIMIT
        over = shadow and hits > 0
        return Verdict(code, limit, reset_ms=limit.cooldown, shadowed=over, shadow=shadow)

    def _untracked(self, limit: RateLimit, hits: int, shadow: bool, now_ms: int) -> Verdict:
        if hits <= limit.requests_per_unit:
            reset = window_end(now_ms, limit.window_ms) - now_ms
            return Verdict(Code.OK, limit, remaining=limit.requests_per_unit - hits, reset_ms=reset)
        return self._deny(limit, hits, shadow)

    def _state(self, hit: Hit, limit: RateLimit, shadow: bool, now_ms: int) -> KeyState | None:
        state = self.keys.get(hit.key)
        if state is not None and state.limit is limit:
            return state
        if state is not None and state.limit == limit:  # same rule reloaded: keep the counts
            state.limit, state.shadow = limit, shadow
            return state
        rule_id = hit.rule.id if hit.rule is not None else ""
        # live_nodes as it is (an int): one object shared by every new key, not a float each
        fresh = KeyState(hit.key, limit, now_ms, self.live_nodes, shadow, rule_id=rule_id)
        if state is not None:  # the rule changed under a reload: start over, keep its counts
            self._orphan(state)
            self._forget(state)
        evicted = self.keys.insert(fresh, now_ms)
        if evicted is None:
            return None
        for victim in evicted:
            self._orphan(victim)
        self._schedules.add((limit.window_ms, limit.spans))
        return fresh

    def _catch_up(self, state: KeyState, now_ms: int) -> None:
        """The key's span has ended since it was last looked at.

        With a shared store the sync loop pushes that span; only the window may have moved on.
        With a private store the span end did nothing for this key: its hits are applied now,
        as of the span's end (see _fold), which spares span ends a visit to every busy key.
        """
        limit = state.limit
        moved = now_ms // limit.window_ms != state.window
        if not self.shared_store:
            if moved and now_ms >= state.next_sync + limit.cooldown:
                state.pending = state.unsent = 0  # a finished window; any block it set is over
            else:
                self._fold(state, state.next_sync)
            state.next_sync = span_end(now_ms, limit.window_ms, limit.spans)
        if moved:
            self.dropped_hits += state.roll(now_ms)

    def _admit(self, state: KeyState, hits: int, now_ms: int) -> None:
        """Count admitted hits; negative hits give quota back (pushed as a negative delta)."""
        state.pending += hits
        state.local_cur = max(0, state.local_cur + hits)
        state.last_hit = now_ms

    def _finish(self, verdict: Verdict, state: KeyState | None, now_ms: int) -> Verdict:
        """Fill in what is left of an OK descriptor's window, after the request's own hits."""
        if state is None or verdict.code is Code.OVER_LIMIT or verdict.shadowed:
            return verdict
        return self._within(state, now_ms)

    def _within(self, state: KeyState, now_ms: int) -> Verdict:
        """OK, with what is left of the window after the request's own hits."""
        limit, rpu = state.limit, state.limit.requests_per_unit
        used = state.seen + (state.inflight + state.pending) * state.nodes  # state.used()
        reset = limit.window_ms - now_ms % limit.window_ms  # until the window ends
        near = used >= NEAR_LIMIT_RATIO * rpu
        remaining = int(rpu - used) if used < rpu else 0
        # One tuple of every field: this runs for every admitted request.
        return _verdict((Code.OK, limit, False, remaining, reset, False, state.shadow, near))

    # -- sync path ----------------------------------------------------------------------

    def shortest_span_ms(self) -> int | None:
        """The shortest span among tracked rules; sync timeouts must fit in half of it."""
        return min((w // n for w, n in self._schedules), default=None)

    def next_span_end(self, now_ms: int) -> int | None:
        """When the next span of any tracked rule ends; None when nothing is tracked."""
        if not self._schedules:
            return None
        return min(span_end(now_ms, w, n) for w, n in self._schedules)

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
        plan = self._plan = SyncPlan(now_ms)
        plan.add_orphans(self._orphans)
        self._orphans = []
        for index, state in enumerate(self._due_candidates(now_ms, flush)):
            if not self.shared_store:
                self._settle(state, now_ms, flush)
            elif flush or now_ms >= state.next_sync:
                self._plan_key(plan, state, now_ms)
            if index % keys_per_step == keys_per_step - 1:
                yield index + 1

    def _due_candidates(self, now_ms: int, flush: bool) -> list[KeyState]:
        """The keys a span end must look at: all of them with a shared store (every active key
        is pushed), when flushing, or when a private store's sweep is due; else none."""
        if self.shared_store or flush:
            return list(self.keys)
        if now_ms >= self._next_sweep:
            self._next_sweep = now_ms + LOCAL_SWEEP_MS
            return list(self.keys)
        return []

    def _forget(self, state: KeyState) -> None:
        self.keys.remove(state.key)

    def batch_in_flight(self) -> SyncBatch:
        if self._plan is None:
            raise RuntimeError("no sync in flight")
        return self._plan.batch

    def _plan_key(self, plan: SyncPlan, state: KeyState, now_ms: int) -> None:
        self.dropped_hits += state.roll(now_ms)
        limit = state.limit
        state.next_sync = span_end(now_ms, limit.window_ms, limit.spans)
        if state.idle(now_ms):
            self._forget(state)
            return
        retried = self._plan_unsent(plan, state) if state.unsent else False
        # Every active key is pushed each span, even with nothing to add: the answer carries
        # the window's global total and the block flag, and the store's work per span follows
        # the number of active keys, not the request rate. A key whose last span's hits are
        # being pushed for the window that just ended (they were counted after it closed)
        # already gets its flag back from that push: one push per key and span either way.
        if state.pending or not retried:
            plan.push(state, Push(state.key, state.window, state.pending, limit))
            state.inflight, state.pending = state.pending, 0
        first_span_over = span_index(now_ms, limit.window_ms, limit.spans) >= 1
        if state.estimate_window >= 0 and first_span_over:
            plan.read_total(state, TotalRead(state.key, state.estimate_window))

    def _settle(self, state: KeyState, now_ms: int, flush: bool) -> None:
        """A private store's sweep: forget an idle key; or, at shutdown, apply every count."""
        if flush:
            if now_ms >= state.next_sync:
                self._catch_up(state, now_ms)
            self._fold(state, now_ms)
            return
        if now_ms - state.last_hit < max(LOCAL_IDLE_MS, 2 * state.limit.window_ms):
            return
        if state.pending:  # its last span may still start a block
            self._fold(state, state.next_sync)
        if now_ms >= state.blocked_until:
            self._forget(state)

    def _fold(self, state: KeyState, end_ms: int) -> None:
        """What a span end at `end_ms` does with a private store, without a round trip.

        Its total is this node's own count, so the span's hits join `seen`, and a window over
        the limit blocks for the cooldown (as a shared store's total and flag would). Counts of
        a finished window need no push: nobody reads them again.
        """
        state.roll(end_ms)  # leftovers of a finished window go to `unsent`, dropped below
        state.unsent = 0
        state.estimate_window = NO_WINDOW  # nodes stays 1: no other node writes this store
        if state.pending:
            state.seen += state.pending
            state.pending = 0
            if state.seen > state.limit.requests_per_unit:
                state.block(end_ms + state.limit.cooldown)

    def _plan_unsent(self, plan: SyncPlan, state: KeyState) -> bool:
        """Push hits left from an earlier span (or count them dropped); True if pushed."""
        pushed = state.window - state.unsent_window <= 1
        if pushed:
            retry = Push(state.key, state.unsent_window, state.unsent, state.limit)
            plan.push(state, retry, fresh=False)
        else:
            self.dropped_hits += state.unsent
        state.unsent = 0
        return pushed

    def apply_sync(
        self, now_ms: int, batch: SyncBatch, result: SyncResult | None, resend: bool = True
    ) -> SyncStats:
        """Apply the store's answer to `batch`, or the fallback rule if `result` is None.

        After a failure, `resend` says whether the pushes may be sent again: True when they
        surely did not arrive (connection refused), False when they may have been applied
        (a timeout), so that a retry can never count the same hits twice.
        """
        plan = self._plan
        if plan is None or plan.batch is not batch:
            raise RuntimeError("apply_sync for a batch that is not in flight")
        self._plan = None
        if result is None:
            stats = plan.fail(now_ms, resend)
        else:
            if result.live_nodes > 0:
                self.live_nodes = result.live_nodes
            stats = plan.succeed(now_ms, result)
        self.dropped_hits += stats.dropped_hits
        return stats

    def _orphan(self, state: KeyState) -> None:
        if not self.shared_store:
            return  # nobody else reads a private store's counts
        for count, window in ((state.unsent, state.unsent_window), (state.pending, state.window)):
            if count:
                self._orphans.append(Push(state.key, window, count, state.limit))
        state.unsent = state.pending = 0

    # -- introspection ------------------------------------------------------------------

    def blocked_keys(self, now_ms: int) -> int:
        return sum(1 for state in self.keys if now_ms < state.blocked_until)

    def pending_hits(self) -> int:
        """Admitted hits not yet confirmed by the store (what a shutdown flush must push)."""
        if not self.shared_store:
            return 0  # a private store is this node's memory: nothing to push or confirm
        tracked = sum(s.pending + s.inflight + s.unsent for s in self.keys)
        return tracked + sum(p.count for p in self._orphans)


def unlimited_verdict(hit: Hit) -> Verdict:
    """The answer for a descriptor no limit applies to: unmatched, or an unlimited rule."""
    return UNLIMITED if hit.rule is not None and hit.rule.unlimited else UNMATCHED

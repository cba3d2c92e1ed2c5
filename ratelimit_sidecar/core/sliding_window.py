"""The sliding-window rule, counted in spans: at most MAX requests in any trailing window.

Windows are cut into N spans on the epoch, as for the fixed window, but nothing resets at a
window's end. At `now` in span s, the trailing window (now - W, now] holds spans s-N+1 .. s
whole and the span s-N in part: its count is weighted by the share of its milliseconds still
inside, (end of s - 1 - now) / (length of s). So a client that sends MAX at the end of one
window and MAX at the start of the next gets about MAX admitted, not 2 x MAX; within one span
the weight assumes the oldest span's hits were spread evenly (a burst at its very end can be
under-weighted by up to that span's count).

A request (`check`, then `count` and `admitted` when it is admitted):

1. A key under an active block (only when the limit sets a `cooldown`) is refused until the
   block ends.
2. The trailing count is estimated from the fleet's span totals as the store last answered them
   (`fleet_spans`) plus this node's own hits the store has not confirmed yet (`own_spans`, by
   the span they were counted in), each standing for `nodes` nodes' worth of traffic, as the
   fixed window scales its own hits. Local-only mode has no store: every own hit stays in
   `own_spans` and `nodes` is 1, so the count is exact.
   If this request's hits, scaled the same way, take the estimate past MAX, it is refused
   with a Retry-After of the time until it would fit if nobody sent more (spans leave the
   window, the oldest one gradually). If even the count known for sure (the store's totals
   plus own hits, unscaled) is over MAX and the limit sets a cooldown, the key is blocked for
   it too, and the Retry-After is the later of the block's end and that time (a block's
   refusals say the same). A request of more than MAX hits never fits: it is refused for one
   window.
3. Admitted: `remaining` is the whole requests left in the trailing window; `reset_ms` is the
   time until the oldest span still counted leaves the window, when quota first comes back
   (0 when nothing is counted: the whole quota is there).

A span end:

- The store's answer (`PushResult.spans`: the fleet's totals of the N spans ending with the
  pushed one) replaces those spans in `fleet_spans`, and confirms the push's own hits: they
  leave `own_spans`, oldest first. An answer without spans confirms nothing.
- The store failed: the hits stay in `own_spans`, scaled by `nodes`, until an answer confirms
  them or they leave the window. With a cooldown, an estimate over MAX then blocks the key.
- Local-only mode: nothing to do, the own counts are already in place.
- The store's answer has the pushed span before every node has pushed it: until the next
  answer, that span counts at least this node's push times `nodes`, as it did before the push.
- `nodes` is learnt as the fixed window learns it (the store counts every push into the
  window's counter too): this rule delegates to a FixedWindow, but from admitted counts only.
  Over a trailing limit every node refuses on its estimate all the time; counting its own
  refusals as offered, and no other node's, made a node of four see a fleet of 2.5 to 3 and
  the fleet admit 118 per MAX of 100 (4 nodes, 5 x MAX offered; 98 with admitted counts).
  There is no lenient ceiling: a trailing window has no window pace to project. Every
  estimate scales own hits by the lower of the last two `nodes` estimates
  (core/nodes_estimate.py, `check_nodes`), as a fixed window's lenient ceiling does: the
  larger one refused 0.1 % of bursty traffic at 0.6 x the limit, where nothing should be.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core.fixed_window import NEAR_LIMIT_RATIO, FixedWindow
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.nodes_estimate import lower_of_last_two
from ratelimit_sidecar.core.spancounts import FleetSpans, SpanCounts, Trailing
from ratelimit_sidecar.core.spans import span_bounds, span_number
from ratelimit_sidecar.core.trailing_wait import retry_wait_ms
from ratelimit_sidecar.core.types import Code, Push, PushResult, Verdict
from ratelimit_sidecar.core.verdicts import blocked, refused

MIN_EARLY_OWN = 5  # own hits (taken low) before a new key's spans may lower its first guess


@dataclass(frozen=True, slots=True)
class SlidingWindow:
    """The rule above."""

    # Learns `nodes` (see the module's docstring for why from admitted counts only).
    nodes_rule: FixedWindow = field(default_factory=lambda: FixedWindow(nodes_from_offered=False))

    # -- a request ---------------------------------------------------------------------------

    def check(self, state: KeyState, hits: int, now_ms: int) -> Verdict | None:
        """Step 1, a block; step 2, this request's hits would take the estimate past MAX."""
        if now_ms < state.blocked_until:
            return blocked(state, hits, now_ms, retry_wait_ms(state, hits, now_ms))
        if hits <= 0:
            return None
        extra = hits * state.check_nodes
        trailing = _trailing(state, now_ms)
        if trailing.fits(extra):
            # Kept for `admitted`, which the same request calls once these hits are counted:
            # one trailing count per request instead of two (8.5 -> 7.4 µs per decision).
            state.checked = (now_ms, state.pending + hits, trailing, extra)
            return None
        return self._over(state, hits, now_ms)

    def _over(self, state: KeyState, hits: int, now_ms: int) -> Verdict:
        """Step 2: with a cooldown, a count over MAX for sure blocks the key for it; else the
        refusal lasts until the request fits. (Unlike the fixed window's, refusals on the
        estimate are not counted as offered: see `nodes` in the module's docstring.)"""
        limit = state.limit
        if limit.cooldown > 0 and not _trailing(state, now_ms, known=True).fits(hits):
            state.block(state.cooldown_end(now_ms))
            return blocked(state, hits, now_ms, retry_wait_ms(state, hits, now_ms))
        return refused(state, retry_wait_ms(state, hits, now_ms))

    def count(self, state: KeyState, hits: int, now_ms: int) -> None:
        own = state.own_spans
        if own is None:
            own = state.own_spans = SpanCounts(state.limit.spans)
        if hits < 0:  # quota given back: only what the store has not confirmed yet
            hits = -own.take_newest(-hits)
        else:
            own.add(span_number(now_ms, state.limit), hits)
        state.pending += hits  # what the next push carries
        state.local_cur = max(0, state.local_cur + hits)
        state.last_hit = now_ms

    def admitted(self, state: KeyState, now_ms: int) -> Verdict:
        limit, rpu = state.limit, state.limit.requests_per_unit
        checked = state.checked
        if checked is not None and checked[0] == now_ms and checked[1] == state.pending:
            trailing, extra = checked[2], checked[3]  # as checked, plus the hits it admitted
            used = trailing.scaled_count() + extra * trailing.length
        else:
            trailing = _trailing(state, now_ms)
            used = trailing.scaled_count()
        remaining = max(0, min(rpu, int((rpu * trailing.length - used) // trailing.length)))
        reset = _until_oldest_leaves(state, trailing, now_ms)
        near = used >= NEAR_LIMIT_RATIO * rpu * trailing.length
        # Every field in order, by position, as the fixed window answers.
        return Verdict(Code.OK, limit, False, remaining, reset, False, state.shadow, near)

    def untracked(self, limit: RateLimit, hits: int, shadow: bool, now_ms: int) -> Verdict:
        """Decided on this request alone: admitted if it fits in an empty window."""
        if hits > limit.requests_per_unit:
            code = Code.OK if shadow else Code.OVER_LIMIT
            return Verdict(code, limit, reset_ms=limit.window_ms, shadowed=shadow, shadow=shadow)
        _, end = span_bounds(span_number(now_ms, limit), limit)
        remaining = min(limit.requests_per_unit, limit.requests_per_unit - hits)
        reset = end - 1 + limit.window_ms - now_ms  # when its own span leaves the window
        return Verdict(Code.OK, limit, remaining=remaining, reset_ms=reset, shadow=shadow)

    # -- eviction ----------------------------------------------------------------------------

    def window_count(self, state: KeyState) -> int:
        """The N spans up to the newest counted one, the store's and this node's own."""
        counted = [spans for spans in (state.fleet_spans, state.own_spans) if spans is not None]
        if not counted:
            return 0
        first = max(spans.newest for spans in counted) - state.limit.spans + 1
        return sum(spans.since(first) for spans in counted)

    def resume(self, state: KeyState, count: int) -> None:
        """Counted in the span the key comes back in: it leaves the window later than the
        hits it stands for did (an over-count, never an under-count), or is replaced by the
        store's total of that span."""
        state.retry_memo = None
        _fleet_spans(state).add(span_number(state.last_hit, state.limit), count)

    # -- a span end --------------------------------------------------------------------------

    def close_span(self, state: KeyState, end_ms: int) -> None:  # noqa: ARG002
        state.pending = 0  # local-only: the own counts are the fleet's, already in place

    def store_answer(self, state: KeyState, push: Push, answer: PushResult, now_ms: int) -> bool:
        state.retry_memo = None  # the counts a Retry-After was computed from change here
        if not answer.spans:
            return False
        limit = state.limit
        newest = push.span if push.span >= 0 else (push.window + 1) * limit.spans - 1
        fleet = _fleet_spans(state)
        for offset, total in enumerate(answer.spans):
            fleet.put(newest - len(answer.spans) + 1 + offset, total)
        if push.count > 0 and state.own_spans is not None:
            state.own_spans.take_oldest(push.count)  # in the store's totals now
        fleet.raise_floor(newest, max(0, push.count) * state.check_nodes)
        self._learn_from_spans(state, newest, push.count, answer.spans)
        return _blocks_over(state, now_ms, known=True)

    def _learn_from_spans(
        self, state: KeyState, newest: int, count: int, spans: tuple[int, ...]
    ) -> None:
        """A new key guesses an even split (`nodes` = live nodes) until its first finished
        window says better. A node with more than its even share then counts each own hit for
        too many, and with no lenient ceiling refused 3 of 60 requests at 0.8 x the limit in
        a new key's first window (3 nodes, 60/30/10 %). So, until then, each span before the
        pushed one (every node pushed it a span ago) adds to sums of the fleet's and this
        node's counts, whose ratio may lower the guess, never raise it. The own sum is taken
        one standard deviation low (a small sample must not look like a big share: 4 even
        nodes with bursts at window ends admitted 123 per MAX of 100 from single spans), and
        spans are skipped once the fleet's trailing count is within a span's share of MAX
        (near the limit the nodes that decide first admit more than their share)."""
        previous, own = state.pushed_span, state.pushed_count
        state.pushed_span, state.pushed_count = newest, max(0, count)
        limit = state.limit
        busy = sum(spans) * limit.spans >= limit.requests_per_unit * (limit.spans - 1)
        if state.nodes_ratio or previous != newest - 1 or len(spans) < 2 or busy:
            return
        state.early_fleet += spans[-2]
        state.early_own += own
        sure = state.early_own - math.sqrt(state.early_own)
        ratio = state.early_fleet / sure if sure >= MIN_EARLY_OWN else 0.0
        if 1.0 <= ratio < state.nodes:
            self.set_nodes(state, ratio)

    def store_failed(self, state: KeyState, count: int, now_ms: int) -> bool:  # noqa: ARG002
        """The hits stay in `own_spans`, scaled by `nodes` in every estimate."""
        return _blocks_over(state, now_ms, known=False)

    def learn_nodes(self, state: KeyState, window: int, total: int, live_nodes: int) -> None:
        self.nodes_rule.learn_nodes(state, window, total, live_nodes)
        state.check_nodes = lower_of_last_two(state)  # see `nodes` in the module's docstring
        state.retry_memo = None

    def after_sync(self, state: KeyState, sync_ms: int) -> None:
        """Nothing to adjust: the ceiling is always MAX."""

    def after_failure(self, state: KeyState) -> None:
        """Nothing to forget: no pace was projected."""

    def set_nodes(self, state: KeyState, nodes: float) -> None:
        self.nodes_rule.set_nodes(state, nodes)
        state.check_nodes = lower_of_last_two(state)
        state.retry_memo = None


def _trailing(state: KeyState, now_ms: int, known: bool = False) -> Trailing:
    """The trailing window at `now_ms`: estimated (this node's unconfirmed hits scaled by
    `nodes`, the span last pushed at least at its floor), or what is `known` for sure."""
    limit = state.limit
    span, start, end = _span_at(now_ms, limit)
    leaving = span - limit.spans
    whole: float = 0
    oldest: float = 0
    nodes = 1 if known else state.check_nodes
    fleet = state.fleet_spans
    if fleet is not None and known:
        whole, oldest = fleet.since(leaving + 1), fleet.get(leaving)
    elif fleet is not None:
        whole, oldest = fleet.estimate_since(leaving + 1), fleet.estimate(leaving)
    own = state.own_spans
    if own is not None:
        whole += own.since(leaving + 1) * nodes
        oldest += own.get(leaving) * nodes
    return Trailing(whole, oldest, end - 1 - now_ms, end - start, limit.requests_per_unit, span)


def _until_oldest_leaves(state: KeyState, trailing: Trailing, now_ms: int) -> int:
    """How long until the oldest span still counted leaves the trailing window (0: none).
    Span j stops counting at the last ms of span j + N, its weight down to 0."""
    if trailing.oldest > 0 and trailing.overlap > 0:
        # The usual answer under steady traffic: the span now leaving still counts, and it
        # leaves when the current span ends (7.4 -> 5.9 µs per decision in process).
        return trailing.overlap
    limit = state.limit
    first = trailing.span - limit.spans + (0 if trailing.overlap > 0 else 1)
    counted = [
        c.oldest_counted(first) for c in (state.fleet_spans, state.own_spans) if c is not None
    ]
    oldest = min((span for span in counted if span is not None), default=None)
    if oldest is None:
        return 0
    _, leaves = span_bounds(oldest + limit.spans, limit)
    return leaves - 1 - now_ms


def _blocks_over(state: KeyState, now_ms: int, known: bool) -> bool:
    """With a cooldown, a count over MAX blocks the key; True if the block is new."""
    limit = state.limit
    if limit.cooldown <= 0 or _trailing(state, now_ms, known).fits(0):
        return False
    was_blocked = now_ms < state.blocked_until
    state.block(state.cooldown_end(now_ms))
    return not was_blocked


def _fleet_spans(state: KeyState) -> FleetSpans:
    if state.fleet_spans is None:
        state.fleet_spans = FleetSpans(state.limit.spans)
    return state.fleet_spans


def _span_at(now_ms: int, limit: RateLimit) -> tuple[int, int, int]:
    """The number of the span holding `now_ms`, its first ms and the first ms after it: what
    `span_number` and `span_bounds` say, in one step (twice per request)."""
    window_ms, spans = limit.window_ms, limit.spans
    offset = now_ms % window_ms
    index = offset * spans // window_ms
    base = now_ms - offset
    start = base + (index * window_ms + spans - 1) // spans
    end = base + ((index + 1) * window_ms + spans - 1) // spans
    return now_ms // window_ms * spans + index, start, end

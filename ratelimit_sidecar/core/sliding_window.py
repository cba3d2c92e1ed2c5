"""The sliding-window rule, counted in spans: at most MAX requests in any trailing window.

Spans as for the fixed window, but nothing resets at a window's end. At `now` in span s, the
trailing window (now - W, now] holds spans s-N+1 .. s whole and span s-N weighted by its share
of ms still inside, (end of s - 1 - now) / (length of s): MAX at the end of one window and MAX at
the start of the next admit about MAX, not 2 x MAX (assuming the oldest span's hits spread
evenly: a burst at its very end can be under-weighted by up to its count).

A request (`check`, then `count` and `admitted` when it is admitted):

1. A key under an active block (only with a `cooldown`) is refused until the block ends.
2. The trailing count is estimated from the fleet's span totals as the store last answered
   (`SpanState.fleet`) plus own hits not confirmed yet (`SpanState.own`), each standing for
   `nodes` nodes' worth of traffic (local-only: all hits are own, `nodes` is 1: exact). Hits
   taking it past MAX are refused until they would fit if nobody sent more (spans leave, the
   oldest gradually). If even the count known for sure (unscaled) is over MAX and a cooldown is
   set, the key is blocked too, and the Retry-After is the later of both. More than MAX hits
   never fit: refused for one window.
3. Admitted: `remaining` is the whole requests left; `reset_ms`, when the oldest span still
   counted leaves (0: nothing counted).

A span end:

- The store's answer (`PushResult.spans`: the fleet's totals of the N spans ending with the
  pushed one) replaces those fleet spans and confirms the push's own hits, oldest first. Until
  the next answer the pushed span counts at least this node's push times `nodes` (not every
  node has pushed it yet). An answer without spans confirms nothing.
- The store failed: the hits stay own, scaled by `nodes`, until confirmed or out of the window;
  with a cooldown, an estimate over MAX blocks. Local-only mode: nothing to do.
- At the edge (`consistency: edge`, core/edge.py): a key that never pushed reads the spans
  after a few own hits; a span end's answer leaving the key within reach of MAX reads the
  spans again once the other nodes' pushes of that span are in; a fleet grown since the last
  answer raises `nodes` at once. The store down: nothing asked early.
- `nodes` as for the fixed window, from admitted counts only: over a trailing limit every node
  refuses on its estimate all the time, and its own refusals alone as offered would make a
  fleet too small. No lenient ceiling; every estimate uses the lower of the last two `nodes`.

An RLQS lease (`count_leased`; `strict`, or `edge` near MAX, core/quota_lease.py) is counted as own
hits and pushed at once; its count is the unscaled one (`known_count`), and at each sync what the
buckets have not reported spent moves to the current span (`move_leased`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core.algorithm import SharedAlgorithm
from ratelimit_sidecar.core.edge import reread_due
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.quiet_keys import HELD_TRAILING, EarlySync, read_again_asked
from ratelimit_sidecar.core.spancounts import (
    FleetSpans,
    LeasedSpans,
    SpanCounts,
    SpanState,
    Trailing,
)
from ratelimit_sidecar.core.spans import span_bounds, span_number
from ratelimit_sidecar.core.trailing_wait import retry_wait_ms
from ratelimit_sidecar.core.types import OK, Push, PushResult, Verdict
from ratelimit_sidecar.core.verdicts import refuse_for_cooldown

MIN_EARLY_OWN = 5  # own hits (taken low) before a new key's spans may lower its first guess


@dataclass(frozen=True, slots=True)
class SlidingWindow(SharedAlgorithm):
    early: EarlySync | None = None  # where a key at the edge asks for a push (core/fleet.py)

    def start(self, state: KeyState, resumed: int) -> None:
        """`resumed` is counted in the span of the key's return: it leaves later than its hits
        would (over-counts, never under), or the store's total of that span replaces it."""
        state.counts = SpanState()
        state.nodes.caution(True)  # see `nodes` in the module's docstring
        if resumed:
            _fleet_spans(state).add(span_number(state.last_hit, state.limit), resumed)

    def check(self, state: KeyState, hits: int, now_ms: int) -> Verdict | None:
        extra = hits * state.nodes.check
        trailing = _trailing(state, now_ms)
        if trailing.fits(extra):
            # For `admitted` of the same request: one trailing count per request, not two.
            state.span_state().checked = (now_ms, state.pending + hits, trailing, extra)
            return None
        return self._over(state, hits, now_ms)

    def _over(self, state: KeyState, hits: int, now_ms: int) -> Verdict:
        """Refusals on the estimate are not counted as offered (see `nodes` above)."""
        over = state.limit.cooldown > 0 and not _trailing(state, now_ms, known=True).fits(hits)
        return refuse_for_cooldown(state, hits, now_ms, retry_wait_ms, block=over)

    def wait_ms(self, state: KeyState, hits: int, now_ms: int) -> int:
        return retry_wait_ms(state, hits, now_ms)

    def count(self, state: KeyState, hits: int, now_ms: int) -> None:
        counts = state.span_state()
        own = counts.own
        if own is None:
            own = counts.own = SpanCounts(state.limit.spans)
        if hits < 0:  # quota given back: only what the store has not confirmed yet
            hits = -own.take_newest(-hits)
        else:
            own.add(span_number(now_ms, state.limit), hits)
        state.counted(hits, now_ms)  # what the next push carries
        if state.edge and not counts.pushed and hits > 0 and self.early is not None:
            self.early.first_read(state, now_ms)  # a new key at the edge (core/edge.py)

    def count_leased(self, state: KeyState, hits: int, now_ms: int) -> None:
        """An RLQS lease's tokens (core/quota_lease.py), pushed at once. Given back (negative) in
        full: what the store confirmed already comes off the fleet's count until the push's
        answer replaces it (a lease is confirmed within milliseconds; given back only while
        unconfirmed, as `count` does, almost none of it went back)."""
        counts = state.span_state()
        if counts.leased is None:
            counts.leased = LeasedSpans()
        span = span_number(now_ms, state.limit)
        counts.leased.counted(span, hits)
        if hits >= 0:
            self.count(state, hits, now_ms)
        else:
            taken = counts.own.take_newest(-hits) if counts.own is not None else 0
            if taken < -hits:
                _fleet_spans(state).add(span, hits + taken)
            state.counted(hits, now_ms)
        early = self.early
        if hits and early is not None and early.store_up:
            early.want(now_ms, state)

    @staticmethod
    def move_leased(state: KeyState, now_ms: int) -> list[tuple[int, int]]:
        """A sync: the leased tokens not reported spent move to the current span (`LeasedSpans`);
        the moves to push, already in the fleet's counts here."""
        leased, limit = state.span_state().leased, state.limit
        if leased is None:
            return []
        span = span_number(now_ms, limit)
        moves = leased.move_to(span, now_ms, limit.window_ms, span - limit.spans)
        for moved, hits in moves:
            _fleet_spans(state).add(moved, hits)
        return moves

    def known_count(self, state: KeyState, now_ms: int) -> int:
        """The trailing count the store answered and own hits not confirmed yet, unscaled: a
        leased counter's (every node counts its leases and pushes them at once)."""
        trailing = _trailing(state, now_ms, known=True)
        return math.ceil(trailing.scaled_count() / trailing.length)

    def admitted(self, state: KeyState, now_ms: int) -> Verdict:
        limit, rpu = state.limit, state.limit.requests_per_unit
        checked = state.span_state().checked
        if checked is not None and checked[0] == now_ms and checked[1] == state.pending:
            trailing, extra = checked[2], checked[3]  # as checked, plus the hits it admitted
            used = trailing.scaled_count() + extra * trailing.length
        else:
            trailing = _trailing(state, now_ms)
            used = trailing.scaled_count()
        remaining = max(0, min(rpu, int((rpu * trailing.length - used) // trailing.length)))
        reset = _until_oldest_leaves(state, trailing, now_ms)
        near = used >= limit.near_limit_ratio * rpu * trailing.length
        return Verdict(OK, limit, False, remaining, reset, False, state.rule.shadow_mode, near)

    def window_count(self, state: KeyState) -> int:
        """The N spans up to the newest counted one, the store's and this node's own."""
        counts = state.span_state()
        counted = [spans for spans in (counts.fleet, counts.own) if spans is not None]
        if not counted:
            return 0
        first = max(spans.newest for spans in counted) - state.limit.spans + 1
        return sum(spans.since(first) for spans in counted)

    def _read_again(self, state: KeyState, counts: SpanState, pushed: float, now_ms: int) -> None:
        """Near MAX at the edge, the spans are read again LATE_PUSH_MS after a span's first
        answer: the other nodes' pushes of the span just ended may land after it."""
        early = self.early
        if early is None or not early.store_up or read_again_asked(state, counts, now_ms):
            return
        if reread_due(state.limit, _trailing(state, now_ms), pushed):
            early.read_again(state, counts, now_ms)

    def store_answer(
        self, state: KeyState, push: Push, answer: PushResult | None, now_ms: int
    ) -> bool:
        if answer is None:
            return _blocks_over(state, now_ms, known=False)
        if state.edge and self.early is not None:
            state.nodes.grow(self.early.live_nodes)
        counts = state.span_state()
        counts.retry_memo = None  # the counts a Retry-After was computed from change here
        if not answer.spans:
            return False
        limit = state.limit
        newest = push.span if push.span >= 0 else (push.window + 1) * limit.spans - 1
        fleet = _fleet_spans(state)
        for offset, total in enumerate(answer.spans):
            fleet.put(newest - len(answer.spans) + 1 + offset, total)
        if push.hits > 0 and counts.own is not None:
            counts.own.take_oldest(push.hits)  # in the store's totals now
        fleet.raise_floor(newest, max(0, push.hits) * state.nodes.check)
        _learn_from_spans(state, counts, newest, push.hits, answer.spans)
        if state.edge:
            self._read_again(state, counts, fleet.estimate(newest), now_ms)
        return _blocks_over(state, now_ms, known=True)


def _learn_from_spans(
    state: KeyState, counts: SpanState, newest: int, count: int, spans: tuple[int, ...]
) -> None:
    """A new key's even split refuses under the limit on a node with more than that share, until
    its first finished window. So each span before the pushed one (all nodes pushed it) adds to
    sums of fleet and own counts, whose ratio may lower the guess: own taken one standard
    deviation low (a small sample is no big share), spans skipped within a span's share of MAX
    (there the first deciders admit more than their share), the others' held hits added."""
    previous, own = counts.pushed_span, counts.pushed_count
    counts.pushed_span, counts.pushed_count = newest, max(0, count)
    limit, nodes = state.limit, state.nodes
    busy = sum(spans) * limit.spans >= limit.requests_per_unit * (limit.spans - 1)
    if nodes.ratio or previous != newest - 1 or len(spans) < 2 or busy:
        return
    counts.early_fleet += spans[-2]
    counts.early_own += own
    sure = counts.early_own - math.sqrt(counts.early_own)
    ratio = (counts.early_fleet + _held_elsewhere(state)) / sure if sure >= MIN_EARLY_OWN else 0.0
    if 1.0 <= ratio < nodes.value:
        nodes.set(ratio)


def _held_elsewhere(state: KeyState) -> int:
    """At the edge each other node may hold a hit of a key it never pushed (core/quiet_keys.py):
    missing from the spans it fell in, a fleet total learnt from them looks that much smaller."""
    return max(0, state.nodes.live - 1) * HELD_TRAILING if state.edge else 0


def _trailing(state: KeyState, now_ms: int, known: bool = False) -> Trailing:
    """Estimated (own unconfirmed hits scaled, the last pushed span at its floor), or `known`."""
    limit = state.limit
    span, start, end = _span_at(now_ms, limit)
    leaving = span - limit.spans
    whole: float = 0.0
    oldest: float = 0.0
    nodes = 1.0 if known else state.nodes.check
    counts = state.span_state()
    fleet = counts.fleet
    if fleet is not None and known:
        whole, oldest = float(fleet.since(leaving + 1)), float(fleet.get(leaving))
    elif fleet is not None:
        whole, oldest = fleet.estimate_since(leaving + 1), fleet.estimate(leaving)
    own = counts.own
    if own is not None:
        whole += own.since(leaving + 1) * nodes
        oldest += own.get(leaving) * nodes
    return Trailing(whole, oldest, end - 1 - now_ms, end - start, limit.requests_per_unit, span)


def _until_oldest_leaves(state: KeyState, trailing: Trailing, now_ms: int) -> int:
    """0: none counted. Span j stops counting at the last ms of span j + N (its weight 0)."""
    if trailing.oldest > 0 and trailing.overlap > 0:
        # The usual answer under steady traffic: the span now leaving still counts, and it
        # leaves when the current span ends: no walk over the spans.
        return trailing.overlap
    limit = state.limit
    first = trailing.span - limit.spans + (0 if trailing.overlap > 0 else 1)
    counts = state.span_state()
    counted = [c.oldest_counted(first) for c in (counts.fleet, counts.own) if c is not None]
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
    return state.block(state.cooldown_end(now_ms), now_ms)


def _fleet_spans(state: KeyState) -> FleetSpans:
    counts = state.span_state()
    if counts.fleet is None:
        counts.fleet = FleetSpans(state.limit.spans)
    return counts.fleet


def _span_at(now_ms: int, limit: RateLimit) -> tuple[int, int, int]:
    """`span_number` and `span_bounds` in one step (twice per request)."""
    window_ms, spans = limit.window_ms, limit.spans
    offset = now_ms % window_ms
    index = offset * spans // window_ms
    base = now_ms - offset
    start = base + (index * window_ms + spans - 1) // spans
    end = base + ((index + 1) * window_ms + spans - 1) // spans
    return now_ms // window_ms * spans + index, start, end

"""A sliding window's Retry-After: until a refused request fits if nobody sends more, not before
the block ends. The walk tries each span start from now on: the spans wholly inside plus the
weighted oldest must leave room for the hits scaled by `nodes`, as the check does (strict.lua
walks the same way). A blocked key is asked on every request, so the answer is kept
(`SpanState.retry_memo`) until its counts, `nodes` or block change.
"""

from __future__ import annotations

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.spans import span_bounds, span_number

NEVER_DRAINED = 2**62


def retry_wait_ms(state: KeyState, hits: int, now_ms: int) -> int:
    """The later of the block's end and the time `hits` fit (a short cooldown waits)."""
    blocked_until = state.blocked_until
    if hits <= 0 or blocked_until >= _drained_at(state, hits):  # it fits by the block's end
        return max(blocked_until, now_ms) - now_ms
    counts = state.span_state()
    memo, asked = counts.retry_memo, (blocked_until, state.pending, hits, state.nodes.check)
    if memo is not None and memo[:4] == asked:
        return max(blocked_until, memo[4], now_ms) - now_ms
    fits_at = now_ms + _wait_ms(state, hits, now_ms)
    if now_ms < blocked_until:
        counts.retry_memo = (*asked, fits_at)
    return max(blocked_until, fits_at) - now_ms


def _drained_at(state: KeyState, hits: int) -> int:
    """When every counted span has left the window (0: none); over MAX: never."""
    limit = state.limit
    if hits * state.nodes.check > limit.requests_per_unit:
        return NEVER_DRAINED
    counts = state.span_state()
    counted = (counts.fleet, counts.own)
    newest = max((c.newest for c in counted if c is not None), default=-1)
    if newest < 0:
        return 0
    return span_bounds(newest + limit.spans, limit)[1] - 1


def _wait_ms(state: KeyState, hits: int, now_ms: int) -> int:
    """Each span's count from the window's oldest to the newest counted (a store's answer may
    count a later span: a retried push lands in its window's last span), walked."""
    span = span_number(now_ms, state.limit)
    kept = state.span_state()
    held = [c.newest for c in (kept.fleet, kept.own) if c is not None]
    spans = range(span - state.limit.spans, max([span, *held]) + 1)
    counts = [_span_count(state, j) for j in spans]
    return walk_wait_ms(state.limit, counts, hits * state.nodes.check, now_ms)


def walk_wait_ms(limit: RateLimit, counts: list[float], extra: float, now_ms: int) -> int:
    """The wait for `extra` (hits times `nodes`) given each span's count, the oldest first."""
    max_hits = limit.requests_per_unit
    if extra > max_hits:
        return limit.window_ms  # never fits: as long as a window
    span = span_number(now_ms, limit)
    inside = _suffix_sums(counts)  # inside[i]: sum(counts[i:]), one pass, not one per step
    for step in range(len(counts) + 1):
        start, end = span_bounds(span + step, limit)
        at = max(now_ms, start)
        oldest = counts[step] if step < len(counts) else 0
        room = (max_hits - inside[min(step + 1, len(counts))] - extra) * (end - start)
        if room >= 0 and oldest * (end - 1 - at) <= room:
            return at - now_ms
        if room >= 0:  # later in this span, once enough of the oldest span is out
            return end - 1 - int(room // oldest) - now_ms
    return limit.window_ms  # not reached: the last step has nothing left to count


def _suffix_sums(counts: list[float]) -> list[float]:
    """sums[i] = sum(counts[i:]), sums[-1] = 0: O(spans) rather than O(spans²)."""
    sums: list[float] = [0] * (len(counts) + 1)  # ints stay ints: exact, as sum() was
    for index in range(len(counts) - 1, -1, -1):
        sums[index] = counts[index] + sums[index + 1]
    return sums


def _span_count(state: KeyState, span: int) -> float:
    """As the request check estimates it."""
    fleet, own = state.span_state().fleet, state.span_state().own
    counted = own.get(span) * state.nodes.check if own is not None else 0
    if fleet is not None:
        counted += fleet.estimate(span)
    return counted

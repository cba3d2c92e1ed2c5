"""The sliding-log rule: at most MAX requests in any trailing window, exactly, on one node.

The key keeps the time of every hit it admitted in the trailing window (now - W, now], hits of
the same millisecond as one entry (core/hitlog.py): at most MAX entries. A log cannot be
rebuilt from span totals, so this rule runs only where the node's own counts are the fleet's:
local-only mode (`LocalLimiter`): it is an `Algorithm`, not a `SharedAlgorithm`. The
configuration refuses an eventual sliding log with a shared store, and a strict one decides
against the store's log (its local fallback uses a sliding window twin of the limit).

A request (`check`, then `count` and `admitted` when it is admitted):

1. A key under an active block (only when the limit sets a `cooldown`) is refused until the
   block ends.
2. Entries that left the trailing window are dropped. If this request's hits take the log's
   total past MAX, it is refused (with a cooldown, the key is blocked for it too). Either
   refusal's Retry-After is the time until enough of the oldest entries leave for the request
   to fit, and not before the block ends (`retry_wait_ms`). A request of more than MAX hits
   never fits: it is refused for one window.
3. Admitted: the hits join the log; `remaining` is MAX minus the log's total, and `reset_ms`
   the time until the oldest entry leaves the window (when quota first comes back).

Span ends change nothing: a hit counts from the moment it is logged until it is W old.
"""

from __future__ import annotations

from dataclasses import dataclass

from ratelimit_sidecar.core.hitlog import HitLog
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.types import Code, Verdict
from ratelimit_sidecar.core.verdicts import refuse_for_cooldown


@dataclass(frozen=True, slots=True)
class SlidingLog:
    """The rule above."""

    def start(self, state: KeyState, resumed: int) -> None:
        """`resumed` is logged at the time the key comes back: it leaves the window later than
        the hits it stands for did (an over-count, never an under-count)."""
        state.counts = HitLog(state.limit.requests_per_unit)
        if resumed:
            state.counts.add(state.last_hit, resumed)

    def check(self, state: KeyState, hits: int, now_ms: int) -> Verdict | None:
        limit = state.limit
        if _log(state, now_ms).total + hits <= limit.requests_per_unit:
            return None
        return refuse_for_cooldown(state, hits, now_ms, retry_wait_ms, block=limit.cooldown > 0)

    def wait_ms(self, state: KeyState, hits: int, now_ms: int) -> int:
        return retry_wait_ms(state, hits, now_ms)

    def count(self, state: KeyState, hits: int, now_ms: int) -> None:
        log = _log(state, now_ms)
        if hits < 0:  # quota given back: the newest hits first
            hits = -log.take_newest(-hits)
        else:
            log.add(now_ms, hits)
        state.counted(hits, now_ms)  # span bookkeeping only: nothing is pushed from a log

    def admitted(self, state: KeyState, now_ms: int) -> Verdict:
        limit, rpu = state.limit, state.limit.requests_per_unit
        log = _log(state, now_ms)
        remaining = min(rpu, max(0, rpu - log.total))
        reset = log.times[0] + limit.window_ms - now_ms if log.times else 0
        near = log.total >= limit.near_limit_ratio * rpu
        return Verdict(Code.OK, limit, False, remaining, reset, False, state.rule.shadow_mode, near)

    def window_count(self, state: KeyState) -> int:
        log: HitLog = state.counts
        return log.total

    def close_span(self, state: KeyState, end_ms: int) -> None:  # noqa: ARG002
        """A hit counts from the moment it is logged until it is W old: the span's hits are
        in the log already."""
        state.pending = 0


def retry_wait_ms(state: KeyState, hits: int, now_ms: int) -> int:
    """A refusal's Retry-After: until enough of the oldest entries leave for `hits` to fit
    (a request of more than MAX hits never fits: one window), and not before a block ends
    (a cooldown may end before the log has room again)."""
    limit, log = state.limit, _log(state, now_ms)
    fits_at = now_ms
    over = log.total + hits - limit.requests_per_unit if hits > 0 else 0
    if hits > limit.requests_per_unit:
        fits_at = now_ms + limit.window_ms
    elif over > 0 and state.blocked_until < log.times[-1] + limit.window_ms:  # else drained
        fits_at = log.time_freeing(over) + limit.window_ms
    return max(state.blocked_until, fits_at) - now_ms


def _log(state: KeyState, now_ms: int) -> HitLog:
    """The key's log, without the entries that have left the window at `now_ms`."""
    log: HitLog = state.counts
    log.expire(now_ms - state.limit.window_ms + 1)
    return log

"""The sliding-log rule: at most MAX requests in any trailing window, exactly, on one node.

A key logs the time of every admitted hit in (now - W, now] (core/hitlog.py). A log cannot be
rebuilt from span totals, so this runs only where a node's counts are the fleet's, local-only mode:
an `Algorithm`, not a `SharedAlgorithm`. Config refuses an eventual log with a shared store; a
strict one decides on the store's log (its local fallback is a sliding-window twin). A request over
MAX is refused (and blocked, with a cooldown) until enough of the oldest entries leave, not before
the block ends; more than MAX never fits: one window. `reset_ms` is when the oldest entry leaves.
Span ends change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ratelimit_sidecar.core.algorithm import Algorithm
from ratelimit_sidecar.core.hitlog import HitLog
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.types import OK, Verdict
from ratelimit_sidecar.core.verdicts import refuse_for_cooldown


@dataclass(frozen=True, slots=True)
class SlidingLog(Algorithm):
    def start(self, state: KeyState, resumed: int) -> None:
        """`resumed` is logged at the return, later than its hits: over-counts, never under."""
        log = HitLog(state.limit.requests_per_unit)
        if resumed:
            log.add(state.last_hit, resumed)
        state.counts = log

    def check(self, state: KeyState, hits: int, now_ms: int) -> Verdict | None:
        limit = state.limit
        if _log(state, now_ms).total + hits <= limit.requests_per_unit:
            return None
        return refuse_for_cooldown(state, hits, now_ms, self.wait_ms, block=limit.cooldown > 0)

    def wait_ms(self, state: KeyState, hits: int, now_ms: int) -> int:
        """Until enough of the oldest entries leave for `hits` to fit, not before a block ends."""
        limit, log = state.limit, _log(state, now_ms)
        fits_at = now_ms
        over = log.total + hits - limit.requests_per_unit if hits > 0 else 0
        if hits > limit.requests_per_unit:
            fits_at = now_ms + limit.window_ms
        elif over > 0 and state.blocked_until < log.times[-1] + limit.window_ms:  # else drained
            fits_at = log.time_freeing(over) + limit.window_ms
        return max(state.blocked_until, fits_at) - now_ms

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
        return Verdict(OK, limit, False, remaining, reset, False, state.rule.shadow_mode, near)

    def window_count(self, state: KeyState) -> int:
        log = state.hit_log()
        return log.total


def _log(state: KeyState, now_ms: int) -> HitLog:
    log = state.hit_log()
    log.expire(now_ms - state.limit.window_ms + 1)
    return log

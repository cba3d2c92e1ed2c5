"""The sliding-log rule: at most MAX requests in any trailing window, exactly, on one node.

The key keeps the time of every hit it admitted in the trailing window (now - W, now], hits of
the same millisecond as one entry (core/hitlog.py): at most MAX entries. A log cannot be
rebuilt from span totals, so this rule runs only where the node's own counts are the fleet's:
local-only mode (`LocalLimiter`). The configuration refuses an eventual sliding log with a
shared store, and a strict one decides against the store's log (its local fallback uses a
sliding window twin of the limit). Should a `FleetLimiter` still get a sliding-log key, it
decides it as a sliding window (core/sliding_window.py): `FleetLimiter` maps the name to that
rule, whose span counts a store can sum.

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

from dataclasses import dataclass, field

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core.fixed_window import NEAR_LIMIT_RATIO, FixedWindow
from ratelimit_sidecar.core.hitlog import HitLog
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.types import Code, Push, PushResult, Verdict
from ratelimit_sidecar.core.verdicts import blocked, refused


@dataclass(frozen=True, slots=True)
class SlidingLog:
    """The rule above."""

    nodes_rule: FixedWindow = field(default_factory=FixedWindow)  # a fleet's, should it run

    # -- a request ---------------------------------------------------------------------------

    def check(self, state: KeyState, hits: int, now_ms: int) -> Verdict | None:
        if now_ms < state.blocked_until:
            return blocked(state, hits, now_ms, retry_wait_ms(state, hits, now_ms))
        if hits <= 0:
            return None
        limit = state.limit
        if _log(state, now_ms).total + hits <= limit.requests_per_unit:
            return None
        if limit.cooldown > 0:
            state.block(state.cooldown_end(now_ms))
            return blocked(state, hits, now_ms, retry_wait_ms(state, hits, now_ms))
        return refused(state, retry_wait_ms(state, hits, now_ms))

    def count(self, state: KeyState, hits: int, now_ms: int) -> None:
        log = _log(state, now_ms)
        if hits < 0:  # quota given back: the newest hits first
            hits = -log.take_newest(-hits)
        else:
            log.add(now_ms, hits)
        state.pending += hits  # span bookkeeping only: nothing is pushed from a log
        state.local_cur = max(0, state.local_cur + hits)
        state.last_hit = now_ms

    def admitted(self, state: KeyState, now_ms: int) -> Verdict:
        limit, rpu = state.limit, state.limit.requests_per_unit
        log = _log(state, now_ms)
        remaining = min(rpu, max(0, rpu - log.total))
        reset = log.times[0] + limit.window_ms - now_ms if log.times else 0
        near = log.total >= NEAR_LIMIT_RATIO * rpu
        return Verdict(Code.OK, limit, False, remaining, reset, False, state.shadow, near)

    def untracked(
        self,
        limit: RateLimit,
        hits: int,
        shadow: bool,
        now_ms: int,  # noqa: ARG002  (a log admits at any time what fits in it)
    ) -> Verdict:
        """Decided on this request alone: admitted if it fits in an empty log."""
        if hits > limit.requests_per_unit:
            code = Code.OK if shadow else Code.OVER_LIMIT
            return Verdict(code, limit, reset_ms=limit.window_ms, shadowed=shadow, shadow=shadow)
        remaining = min(limit.requests_per_unit, limit.requests_per_unit - hits)
        return Verdict(Code.OK, limit, remaining=remaining, reset_ms=limit.window_ms, shadow=shadow)

    # -- eviction ----------------------------------------------------------------------------

    def window_count(self, state: KeyState) -> int:
        return state.hit_log.total if state.hit_log is not None else 0

    def resume(self, state: KeyState, count: int) -> None:
        """Logged at the time the key comes back: it leaves the window later than the hits
        it stands for did (an over-count, never an under-count)."""
        _log(state, state.last_hit).add(state.last_hit, count)

    # -- a span end --------------------------------------------------------------------------

    def close_span(self, state: KeyState, end_ms: int) -> None:  # noqa: ARG002
        state.pending = 0

    def store_answer(
        self,
        state: KeyState,  # noqa: ARG002  (never pushed: see the module's docstring)
        push: Push,  # noqa: ARG002
        answer: PushResult,  # noqa: ARG002
        now_ms: int,  # noqa: ARG002
    ) -> bool:
        return False

    def store_failed(self, state: KeyState, count: int, now_ms: int) -> bool:  # noqa: ARG002
        return False

    def learn_nodes(self, state: KeyState, window: int, total: int, live_nodes: int) -> None:
        self.nodes_rule.learn_nodes(state, window, total, live_nodes)

    def after_sync(self, state: KeyState, sync_ms: int) -> None:
        """Nothing to adjust: the log is exact."""

    def after_failure(self, state: KeyState) -> None:
        """Nothing to forget."""

    def set_nodes(self, state: KeyState, nodes: float) -> None:
        self.nodes_rule.set_nodes(state, nodes)


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
    log = state.hit_log
    if log is None:
        log = state.hit_log = HitLog(state.limit.requests_per_unit)
    log.expire(now_ms - state.limit.window_ms + 1)
    return log

"""The state of one tracked counter (a rule plus the descriptor values that matched it)."""

from __future__ import annotations

import math

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core.spans import span_end, window_of
from ratelimit_sidecar.core.types import KeyId

NO_WINDOW = -1
# A lenient ceiling is at least this many standard deviations of the noise in the estimate's
# extrapolation of one span of this node's own hits (Poisson: sd = nodes x sqrt(hits/span)).
NOISE_SIGMAS = 3.0


class KeyState:
    """Counts for one key. Mutated only by the limiter, on one thread.

    `pending` are hits admitted in the current span of `window` and not yet handed to the
    store; `inflight` is what the running sync is pushing for `window`; `unsent` is what an
    earlier push could not deliver (or a window roll left behind), for `unsent_window`.
    """

    __slots__ = (
        "blocked_until",
        "ceiling",
        "check_nodes",
        "estimate_local",
        "estimate_rejected",
        "estimate_window",
        "inflight",
        "key",
        "last_hit",
        "limit",
        "local_cur",
        "local_prev",
        "next_sync",
        "nodes",
        "nodes_prev",
        "pending",
        "rejected",
        "rule_id",
        "seen",
        "shadow",
        "unsent",
        "unsent_window",
        "window",
    )

    def __init__(
        self,
        key: KeyId,
        limit: RateLimit,
        now_ms: int,
        nodes: float,
        shadow: bool,
        *,
        rule_id: str = "",
    ) -> None:
        self.key = key
        self.rule_id = rule_id
        self.limit = limit
        self.shadow = shadow
        self.window = window_of(now_ms, limit.window_ms)
        self.next_sync = span_end(now_ms, limit.window_ms, limit.spans)
        self.pending = 0
        self.inflight = 0
        self.unsent = 0
        self.unsent_window = NO_WINDOW
        self.local_cur = 0
        self.local_prev = 0
        self.rejected = 0  # hits rejected on the estimate alone in `window` (offered, not admitted)
        self.seen = 0
        self.nodes = nodes
        self.nodes_prev = 0.0  # the estimate before the last one; 0 until there are two
        # The request check: an estimate over `ceiling`, computed with `check_nodes`, rejects
        # (see tune). Strict until a sync shows the window's pace: MAX and the plain estimate.
        # MAX itself, not a float copy: one object every key of the limit shares.
        self.ceiling: float = limit.requests_per_unit
        self.check_nodes = nodes
        self.blocked_until = 0
        self.last_hit = now_ms
        self.estimate_window = NO_WINDOW  # a finished window whose global total we still want
        self.estimate_local = 0  # what this node admitted in that window
        self.estimate_rejected = 0  # ... and rejected on its estimate alone

    def used(self) -> float:
        """Best estimate of the fleet's count in the current window."""
        return self.seen + (self.inflight + self.pending) * self.nodes

    def set_nodes(self, nodes: float) -> None:
        """A new estimate from a finished window (the first replaces the node-level guess)."""
        self.nodes_prev = self.nodes if self.nodes_prev else nodes
        self.nodes = nodes
        self.refresh_check()

    def tune(self, sync_ms: int) -> None:
        """After a sync: how far an estimate may pass MAX before it rejects, for one span.

        The window's pace so far (`seen` over the time since the window began) projects its
        total. Where that stays under MAX x (1 + 1/N), the bound the fleet accepts anyway, an
        estimate may pass MAX by the projection's distance to that bound, at most MAX / N,
        widened to the estimate's own noise on a node with a small share (see `_noise`): near
        the limit a noisy estimate then no longer refuses requests of a window that ends under
        MAX, while a window on course to pass the bound keeps the strict check. The first sync
        of a window (no pace yet) keeps the ceiling the previous window ended with.
        """
        limit = self.limit
        elapsed = sync_ms - self.window * limit.window_ms
        if 2 * elapsed * limit.spans < limit.window_ms:
            return
        rpu = limit.requests_per_unit
        share = rpu / limit.spans
        slack = min(share, max(0.0, rpu + share - self.seen * limit.window_ms / elapsed))
        if slack > 0:
            slack += max(0.0, self._noise(elapsed) - share)
        self.ceiling = rpu + slack
        self.refresh_check()

    def _noise(self, elapsed_ms: int) -> float:
        """NOISE_SIGMAS standard deviations of one span of own hits, scaled by `nodes`."""
        limit = self.limit
        own = max(0, self.local_cur - self.pending)  # pushed so far in this window
        per_span = own * limit.window_ms / (limit.spans * elapsed_ms)
        return NOISE_SIGMAS * self.nodes * math.sqrt(per_span)

    def strict(self) -> None:
        """No leniency: the store did not answer, so the window's pace is unknown."""
        self.ceiling = float(self.limit.requests_per_unit)
        self.refresh_check()

    def refresh_check(self) -> None:
        """A lenient ceiling uses the lower of the last two `nodes` estimates: one window's
        share is noisy (a node blocked earlier than the others in it looks smaller)."""
        lenient = self.ceiling > self.limit.requests_per_unit
        prev = self.nodes_prev or self.nodes
        self.check_nodes = min(self.nodes, prev) if lenient else self.nodes

    def over(self, hits: int) -> bool:
        """The request check: this request's hits would pass the estimate's ceiling, or the
        count known for sure (the store's total plus this node's unpushed hits) passes MAX.
        `Limiter.admit` inlines the same expression."""
        unpushed = self.seen + self.inflight + self.pending + hits
        estimate = self.seen + (self.inflight + self.pending + hits) * self.check_nodes
        return estimate > self.ceiling or unpushed > self.limit.requests_per_unit

    def roll(self, now_ms: int) -> int:
        """Move to the window holding `now_ms`; returns hits dropped by the move."""
        w = now_ms // self.limit.window_ms
        if w == self.window:
            return 0
        dropped = self.stash(self.pending, self.window, w) if self.pending > 0 else 0
        consecutive = w == self.window + 1
        offered = self.local_cur + self.rejected
        self.estimate_window = self.window if consecutive and offered else NO_WINDOW
        self.estimate_local, self.estimate_rejected = self.local_cur, self.rejected
        self.rejected = 0
        self.local_prev = self.local_cur if consecutive else 0
        self.local_cur = self.pending = self.inflight = self.seen = 0
        self.window = w
        return dropped

    def stash(self, count: int, window: int, current: int) -> int:
        """Keep `count` hits of `window` for a later push; returns hits that had to be dropped.

        A delta stays pushable during its own window and the next one (the last span of a
        window is pushed just after it ends); anything older is dropped and counted.
        """
        if count <= 0:
            return 0
        if current - window > 1:
            return count
        if self.unsent and self.unsent_window != window:
            dropped = self.unsent if window > self.unsent_window else count
            if window < self.unsent_window:
                return dropped
            self.unsent, self.unsent_window = count, window
            return dropped
        self.unsent += count
        self.unsent_window = window
        return 0

    def block(self, until_ms: int) -> None:
        self.blocked_until = max(self.blocked_until, until_ms)

    def idle(self, now_ms: int) -> bool:
        """Forgettable: no traffic for two windows, nothing left to push, no active block."""
        return (
            now_ms - self.last_hit >= 2 * self.limit.window_ms
            and not (self.pending or self.inflight or self.unsent)
            and now_ms >= self.blocked_until
        )

    def snapshot(self) -> dict[str, object]:
        """Read-only view for /debug/keys."""
        return {
            "key": list(self.key),
            "rule": self.rule_id,
            "window": self.window,
            "pending": self.pending,
            "inflight": self.inflight,
            "unsent": self.unsent,
            "local": self.local_cur,
            "seen": self.seen,
            "nodes": round(self.nodes, 3),
            "blocked_until_ms": self.blocked_until,
        }

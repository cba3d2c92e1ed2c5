"""The state of one tracked counter (a rule plus the descriptor values that matched it)."""

from __future__ import annotations

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core.hitlog import HitLog
from ratelimit_sidecar.core.penalty import PenaltyState, Tally
from ratelimit_sidecar.core.spancounts import FleetSpans, SpanCounts, Trailing
from ratelimit_sidecar.core.spans import span_end, window_of
from ratelimit_sidecar.core.types import KeyId

NO_WINDOW = -1


class KeyState:
    """Counts for one key. Mutated only by the limiter and its algorithm, on one thread.

    Span bookkeeping: `pending` are hits admitted in the current span of `window` and not yet
    handed to the store; `inflight` is what the running sync is pushing for `window`; `unsent`
    is what an earlier push could not deliver (or a window roll left behind), for
    `unsent_window`. The other fields belong to the decision rule (core/fixed_window.py).
    """

    __slots__ = (
        "admitted_sum",
        "blocked_until",
        "ceiling",
        "check_nodes",
        "checked",
        "early_fleet",
        "early_own",
        "estimate_local",
        "estimate_rejected",
        "estimate_window",
        "fleet_spans",
        "fleet_sum",
        "hit_log",
        "inflight",
        "key",
        "last_hit",
        "limit",
        "local_cur",
        "next_sync",
        "nodes",
        "nodes_prev",
        "nodes_ratio",
        "own_spans",
        "penalty",
        "pending",
        "pushed_count",
        "pushed_span",
        "rejected",
        "rejected_sum",
        "resumed",
        "retry_memo",
        "rule_id",
        "seen",
        "shadow",
        "tat",
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
        tally: Tally | None = None,
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
        self.last_hit = now_ms
        self.blocked_until = 0
        # A limit with `penalty:`: its level and what its client was told (core/penalty.py).
        self.penalty = None if limit.penalty is None else PenaltyState(limit.penalty, tally)
        self.local_cur = 0  # what this node admitted in `window`
        self.rejected = 0  # hits rejected on the estimate alone in `window` (offered, not admitted)
        self.seen = 0  # the store's total for `window`, at the last sync
        self.resumed = 0  # what the key counted in `window` before it was evicted (an estimate)
        self.tat: float = 0  # a token bucket's full-again time, 1/requests_per_unit ms ticks
        self.nodes = nodes
        # What `nodes` is learnt from (core/nodes_estimate.py): the last window's ratio (0
        # until there is one) and decayed sums of the fleet's totals and own counts.
        self.nodes_ratio = 0.0
        self.fleet_sum = self.admitted_sum = self.rejected_sum = 0.0
        self.nodes_prev = 0.0  # the estimate before the last one; 0 until there are two
        # The request check: an estimate over `ceiling`, computed with `check_nodes`, rejects.
        # MAX itself, not a float copy: one object every key of the limit shares.
        self.ceiling: float = limit.requests_per_unit
        self.check_nodes = nodes
        self.estimate_window = NO_WINDOW  # a finished window whose global total we still want
        self.estimate_local = 0  # what this node admitted in that window
        self.estimate_rejected = 0  # ... and rejected on its estimate alone
        # A sliding window's span counts (core/sliding_window.py), made at its first use: the
        # fleet's as the store last answered them, and this node's own not yet confirmed.
        # Unlike the fields above they outlive the window: a trailing window reaches back.
        self.fleet_spans: FleetSpans | None = None
        self.own_spans: SpanCounts | None = None
        # A new key's first share, before it has a finished window to learn from (a sliding
        # window's, core/sliding_window.py): the span of the last push answered and its count,
        # and the sums of the fleet's and this node's counts of the spans since.
        self.pushed_span = -1
        self.pushed_count = 0
        self.early_fleet = 0
        self.early_own = 0
        self.hit_log: HitLog | None = None  # a sliding log's admitted hits (core/sliding_log.py)
        # A sliding window's last request check: (now_ms, pending once its hits are counted,
        # the trailing count it saw, those hits scaled), for the answer that follows it.
        self.checked: tuple[int, int, Trailing, float] | None = None
        # A blocked sliding window's last Retry-After (core/trailing_wait.py): (blocked_until,
        # pending, hits, when they fit), until its counts change.
        self.retry_memo: tuple[int, int, int, int] | None = None

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
        self.local_cur = self.pending = self.inflight = self.seen = self.resumed = 0
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

    def cooldown_end(self, now_ms: int) -> int:
        """When a block starting (or extended) at `now_ms` ends: after the limit's cooldown,
        longer for a key under a penalty."""
        penalty, cooldown = self.penalty, self.limit.cooldown
        return now_ms + (cooldown if penalty is None else penalty.block_length(cooldown, now_ms))

    def idle(self, now_ms: int) -> bool:
        """Forgettable: no traffic for two windows (so none in a trailing window either),
        nothing left to push, no active block, no penalty level (a client refused all along
        sends no counted traffic, and the key must state its level from its next refusal)."""
        return (
            now_ms - self.last_hit >= 2 * self.limit.window_ms
            and not (self.pending or self.inflight or self.unsent)
            and self.settled(now_ms)
            and (self.penalty is None or not self.penalty.current_level(now_ms))
        )

    def settled(self, now_ms: int) -> bool:
        """No active block, and a token bucket is full again: forgetting the key frees none."""
        return now_ms >= self.blocked_until and now_ms * self.limit.requests_per_unit >= self.tat

    def snapshot(self) -> dict[str, object]:
        """Read-only view for /debug/keys."""
        view: dict[str, object] = {
            "key": list(self.key),
            "rule": self.rule_id,
            "window": self.window,
            "pending": self.pending,
            "inflight": self.inflight,
            "unsent": self.unsent,
            "local": self.local_cur,
            "seen": self.seen,
            "resumed": self.resumed,
            "nodes": round(self.nodes, 3),
            "blocked_until_ms": self.blocked_until,
        }
        if self.penalty is not None:
            view["penalty_level"] = self.penalty.level
        for name, spans in (("fleet_spans", self.fleet_spans), ("own_spans", self.own_spans)):
            if spans is not None:  # oldest first, ending with span number `newest`
                view[name] = {"newest": spans.newest, "counts": list(spans.counts)}
        if self.hit_log is not None:
            view["log_hits"] = self.hit_log.total
        return view

"""The state of one tracked counter (a rule plus the descriptor values that matched it)."""

from __future__ import annotations

from typing import Final

from ratelimit_sidecar.config.model import RateLimit, Rule
from ratelimit_sidecar.core.hitlog import HitLog
from ratelimit_sidecar.core.nodes_estimate import NO_WINDOW, NodesEstimate
from ratelimit_sidecar.core.penalty import PenaltyState, RaisedLevels
from ratelimit_sidecar.core.spancounts import SpanState
from ratelimit_sidecar.core.spans import span_end, window_of
from ratelimit_sidecar.core.types import KeyId

__all__ = ["NEVER", "NO_WINDOW", "Bucket", "Counts", "KeyState", "WindowCounts"]
NEVER: Final = float("inf")  # an early push threshold no count reaches (core/quiet_keys.py)


class WindowCounts:
    """A fixed window's own state (core/fixed_window.py) of the key's current window."""

    __slots__ = (
        "alone",
        "ceiling",
        "early_at",
        "edge",
        "edge_from",
        "heard",
        "near",
        "pushed",
        "pushed_ms",
        "resumed",
        "seen",
        "seen_ms",
    )

    def __init__(self, ceiling: float) -> None:
        self.seen = 0  # the store's total for the window, at the last sync
        self.resumed = 0  # what the key counted in the window before its eviction (an estimate)
        self.heard = 0  # a total announced while a push was in flight: `seen` with its answer
        # An estimate over it rejects; MAX itself at first: one object every key shares.
        self.ceiling = ceiling
        self.near = False  # the window came near MAX: synced every span (core/quiet_keys.py)
        self.pushed = False  # this node pushed hits of the window: it pushes all of them
        self.early_at = NEVER  # own unpushed hits past this ask for an early push
        self.alone = False  # a new key's first window, assumed alone here (core/quiet_keys.py)
        self.edge = False  # the window is at its edge: pushed fast (core/edge.py)
        self.pushed_ms = 0  # when this node last pushed the window's hits
        self.seen_ms = 0  # when `seen` last came from the store, at the edge
        self.edge_from = 0.0  # an estimate under this is not at the edge (core/edge.py)

    def next_window(self) -> None:
        self.seen = self.resumed = self.heard = self.pushed_ms = self.seen_ms = 0
        self.near = self.pushed = self.alone = self.edge = False
        self.edge_from = 0.0


class Bucket:
    __slots__ = ("pushed", "reread_span", "tat")

    def __init__(self) -> None:
        self.tat: float = 0.0  # the full-again time, in ticks of 1/requests_per_unit ms
        self.pushed = False  # pushed once: its first read at the edge is done (core/edge.py)
        self.reread_span = -1  # the span whose first answer asked to read again (core/edge.py)


# What an algorithm keeps of a key beside the span bookkeeping, one type per algorithm.
Counts = WindowCounts | Bucket | HitLog | SpanState


class KeyState:
    """Span bookkeeping, alike for every algorithm: `pending`, hits of `window`'s current span not
    yet handed to the store; `inflight`, what the running sync pushes for `window`; `unsent`, what
    an earlier push could not deliver (or a roll left), for `unsent_window`. `counts`: the
    algorithm's own."""

    __slots__ = (
        "blocked_until",
        "counts",
        "edge",
        "inflight",
        "key",
        "last_hit",
        "limit",
        "next_sync",
        "nodes",
        "penalty",
        "pending",
        "rule",
        "tracked",
        "unsent",
        "unsent_window",
        "window",
    )

    def __init__(
        self,
        key: KeyId,
        rule: Rule,
        limit: RateLimit,
        now_ms: int,
        nodes: float,
        *,
        raised: RaisedLevels | None = None,
    ) -> None:
        self.key = key
        self.rule = rule
        self.limit = limit
        self.window = window_of(now_ms, limit.window_ms)
        self.next_sync = span_end(now_ms, limit.window_ms, limit.spans)
        self.pending = 0
        self.inflight = 0
        self.unsent = 0
        self.unsent_window = NO_WINDOW
        self.last_hit = now_ms
        self.blocked_until = 0
        self.penalty = None if limit.penalty is None else PenaltyState(limit.penalty, raised)
        self.nodes = NodesEstimate(nodes)
        self.counts: Counts | None = None  # the algorithm's own, from its `start`
        self.tracked = False  # in the limiter's table (core/keytable.py): a caller may keep it
        # Synced fast near its limit (core/edge.py): what the limit says, until an RLQS report
        # counts into it (a gateway's usage between reports reaches no store: no edge to hold).
        self.edge = limit.edge

    # The counts as the algorithm that keeps them reads them.

    def window_counts(self) -> WindowCounts:
        counts = self.counts
        assert isinstance(counts, WindowCounts), "not a fixed window's key"
        return counts

    def bucket(self) -> Bucket:
        counts = self.counts
        assert isinstance(counts, Bucket), "not a token bucket's key"
        return counts

    def hit_log(self) -> HitLog:
        counts = self.counts
        assert isinstance(counts, HitLog), "not a sliding log's key"
        return counts

    def span_state(self) -> SpanState:
        counts = self.counts
        assert isinstance(counts, SpanState), "not a sliding window's key"
        return counts

    def roll(self, now_ms: int) -> int:
        """Returns hits dropped by the move."""
        w = now_ms // self.limit.window_ms
        if w == self.window:
            return 0
        dropped = self.stash(self.pending, self.window, w) if self.pending > 0 else 0
        self.nodes.roll(self.window, w == self.window + 1)
        counts = self.counts
        if isinstance(counts, WindowCounts):  # only a fixed window's counts end with it
            counts.next_window()
            if self.edge:  # the edge's ceiling ends with the edge (core/edge.py)
                counts.ceiling = float(self.limit.requests_per_unit)
        self.pending = self.inflight = 0
        self.window = w
        return dropped

    def counted(self, hits: int, now_ms: int) -> None:
        """Span bookkeeping for `hits` an algorithm counted (negative: given back)."""
        self.pending += hits
        nodes = self.nodes
        nodes.admitted = max(0, nodes.admitted + hits)
        self.last_hit = now_ms

    def stash(self, count: int, window: int, current: int) -> int:
        """Returns hits dropped: a delta is pushable in its window and the next (its last span)."""
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

    def block(self, until_ms: int, now_ms: int = -1) -> bool:
        """True if the key was not blocked at `now_ms`."""
        was_blocked = now_ms < self.blocked_until
        self.blocked_until = max(self.blocked_until, until_ms)
        return not was_blocked

    def cooldown_end(self, now_ms: int) -> int:
        """A block starting at `now_ms`: longer under a penalty."""
        penalty, cooldown = self.penalty, self.limit.cooldown
        return now_ms + (cooldown if penalty is None else penalty.block_length(cooldown, now_ms))

    def idle(self, now_ms: int) -> bool:
        """No traffic for two windows, nothing to push, settled, no penalty level (a client
        refused all along sends no counted traffic; its next refusal must state the level)."""
        return (
            now_ms - self.last_hit >= 2 * self.limit.window_ms
            and not (self.pending or self.inflight or self.unsent)
            and self.settled(now_ms)
            and (self.penalty is None or not self.penalty.current_level(now_ms))
        )

    def settled(self, now_ms: int) -> bool:
        """No active block, a token bucket full again: forgetting the key frees none."""
        counts = self.counts
        full = not isinstance(counts, Bucket) or now_ms * self.limit.requests_per_unit >= counts.tat
        return now_ms >= self.blocked_until and full

    def snapshot(self) -> dict[str, object]:
        """For /debug/keys."""
        view: dict[str, object] = {
            "key": list(self.key),
            "rule": self.rule.id,
            "window": self.window,
            "pending": self.pending,
            "inflight": self.inflight,
            "unsent": self.unsent,
            "local": self.nodes.admitted,
            "nodes": round(self.nodes.value, 3),
            "blocked_until_ms": self.blocked_until,
        }
        if self.penalty is not None:
            view["penalty_level"] = self.penalty.level
        counts = self.counts
        if isinstance(counts, WindowCounts):
            view["seen"], view["resumed"] = counts.seen, counts.resumed
        elif isinstance(counts, HitLog):
            view["log_hits"] = counts.total
        elif isinstance(counts, SpanState):
            view.update(counts.view())
        return view

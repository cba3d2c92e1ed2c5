"""Counts of a key's most recent spans, by epoch span number.

A sliding window of N spans reads the N spans up to now and the one its trailing edge leaves: N + 1
counts. Older ones never count again: dropped as newer ones arrive, across window boundaries.
"""

from __future__ import annotations

from typing import NamedTuple


class SpanCounts:
    """N + 1 counters; `counts[i]` is the count of span `newest - N + i`."""

    __slots__ = ("counts", "newest")

    def __init__(self, spans: int) -> None:
        self.counts = [0] * (spans + 1)
        self.newest = -1  # no span yet: the first one moves every counter out

    def get(self, span: int) -> int:
        index = span - self.newest + len(self.counts) - 1
        return self.counts[index] if 0 <= index < len(self.counts) else 0

    def since(self, span: int) -> int:
        first = max(0, span - self.newest + len(self.counts) - 1)
        return sum(self.counts[first:])

    def oldest_counted(self, span: int) -> int | None:
        first = max(0, span - self.newest + len(self.counts) - 1)
        for index in range(first, len(self.counts)):
            if self.counts[index]:
                return self.newest - len(self.counts) + 1 + index
        return None

    def add(self, span: int, count: int) -> None:
        self._move_to(span)
        index = span - self.newest + len(self.counts) - 1
        if index >= 0:  # older spans count in no trailing window of `newest` or later
            self.counts[index] += count

    def put(self, span: int, count: int) -> None:
        self._move_to(span)
        index = span - self.newest + len(self.counts) - 1
        if index >= 0:
            self.counts[index] = count

    def take_oldest(self, count: int) -> None:
        for index, held in enumerate(self.counts):
            if count <= 0:
                return
            taken = min(held, count)
            self.counts[index], count = held - taken, count - taken

    def take_newest(self, count: int) -> int:
        """Returns how many were removed."""
        removed = 0
        for index in range(len(self.counts) - 1, -1, -1):
            taken = min(self.counts[index], count - removed)
            self.counts[index] -= taken
            removed += taken
        return removed

    def total(self) -> int:
        return sum(self.counts)

    def _move_to(self, span: int) -> None:
        shift = span - self.newest
        if shift <= 0:
            return
        size = len(self.counts)
        kept = self.counts[shift:] if shift < size else []
        self.counts = kept + [0] * (size - len(kept))
        self.newest = span


class FleetSpans(SpanCounts):
    """The store's span totals; the newest pushed one (not all nodes' yet) at least own x nodes."""

    __slots__ = ("floor", "floor_span")

    def __init__(self, spans: int) -> None:
        super().__init__(spans)
        self.floor_span = -1
        self.floor = 0.0

    def raise_floor(self, span: int, share: float) -> None:
        if span > self.floor_span:
            self.floor_span, self.floor = span, share
        elif span == self.floor_span:
            self.floor += share

    def estimate(self, span: int) -> float:
        return self.get(span) + (self._lift() if span == self.floor_span else 0)

    def estimate_since(self, span: int) -> float:
        return self.since(span) + (self._lift() if self.floor_span >= span else 0)

    def _lift(self) -> float:
        return max(0.0, self.floor - self.get(self.floor_span))


class Trailing(NamedTuple):
    """Scaled by the span's `length`: exact in integers where it can be (local-only mode)."""

    whole: float  # hits of the spans wholly inside
    oldest: float  # hits of the span the window is leaving ...
    overlap: int  # ... of which this many ms are still inside
    length: int  # ms of the current span (the oldest one, a window earlier, is as long)
    max_hits: int
    span: int  # the current span's number

    def scaled_count(self) -> float:
        return self.whole * self.length + self.oldest * self.overlap

    def fits(self, extra: float) -> bool:
        return self.scaled_count() + extra * self.length <= self.max_hits * self.length


class SpanState:
    __slots__ = (
        "checked",
        "early_fleet",
        "early_own",
        "fleet",
        "own",
        "pushed",
        "pushed_count",
        "pushed_span",
        "reread_span",
        "retry_memo",
    )

    def __init__(self) -> None:
        # Made at first use; they outlive the window (a trailing window reaches back).
        self.fleet: FleetSpans | None = None
        self.own: SpanCounts | None = None
        # A new key's first share, with no finished window yet: the last answered push's span
        # and count, and the fleet's and own counts since.
        self.pushed_span = -1
        self.pushed_count = 0
        self.early_fleet = 0
        self.early_own = 0
        self.reread_span = -1  # the span whose first answer asked to read again (core/edge.py)
        self.pushed = False  # pushed once: its first read at the edge is done (core/edge.py)
        # The last check (now_ms, pending after its hits, its Trailing, hits scaled) for its answer.
        self.checked: tuple[int, int, Trailing, float] | None = None
        # A blocked key's last Retry-After: (blocked_until, pending, hits, nodes, fits_at).
        self.retry_memo: tuple[int, int, int, float, int] | None = None

    def view(self) -> dict[str, object]:
        """For /debug/keys, oldest first, ending with span number `newest`."""
        counted = (("fleet_spans", self.fleet), ("own_spans", self.own))
        return {
            name: {"newest": spans.newest, "counts": list(spans.counts)}
            for name, spans in counted
            if spans is not None
        }

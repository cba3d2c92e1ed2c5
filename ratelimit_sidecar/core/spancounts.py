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


class LeasedSpans:
    """Where a trailing window's RLQS leases sit (core/quota_lease.py): the tokens counted but not
    reported spent yet, by the span they are counted in. A lease is counted when it is handed
    out, but a token may be spent any time later; counted where it was handed out, it left the
    trailing window before the request it admitted (simulator, 4 gateways, bursts at twice
    MAX: 358 of 240 in a trailing window). So at each sync they all move to the current span
    (`move_to`): a token is always counted in the span it is spent in or a later one."""

    __slots__ = ("located", "owed")

    def __init__(self) -> None:
        self.located: dict[int, int] = {}  # span: leased tokens counted there, not reported
        self.owed: dict[int, tuple[int, int]] = {}  # bucket: (tokens not reported, as of ms)

    def counted(self, span: int, hits: int) -> None:
        """A lease's tokens counted in `span` (negative: given back there)."""
        self.located[span] = self.located.get(span, 0) + hits

    def owe(self, bucket: int, tokens: int, now_ms: int) -> None:
        """What `bucket` holds counted and not reported spent; the rest of what sits here was
        reported spent and stays where it is counted (the oldest first)."""
        self.owed[bucket] = (tokens, now_ms)
        self._trim()

    def move_to(self, span: int, now_ms: int, forget_ms: int, oldest: int) -> list[tuple[int, int]]:
        """The moves (span, hits) that bring every unreported token to `span`; none out of a span
        before `oldest`, which no trailing window counts any more. A bucket not heard of for
        `forget_ms` is gone (Envoy dropped it): its tokens stay where they are."""
        self.owed = {b: (t, at) for b, (t, at) in self.owed.items() if now_ms - at <= forget_ms}
        self._trim()
        located = [(at, hits) for at, hits in self.located.items() if at != span and hits]
        moved = sum(hits for _, hits in located)
        moves = [(at, -hits) for at, hits in located if at >= oldest]
        if moved:
            moves.append((span, moved))
        self.located = {span: self.located.get(span, 0) + moved}
        return moves

    def _trim(self) -> None:
        excess = sum(self.located.values()) - sum(t for t, _ in self.owed.values())
        for at in sorted(self.located):
            if excess <= 0:
                return
            taken = min(excess, max(0, self.located[at]))
            self.located[at] -= taken
            excess -= taken


class SpanState:
    __slots__ = (
        "checked",
        "early_fleet",
        "early_own",
        "fleet",
        "leased",
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
        self.leased: LeasedSpans | None = None  # RLQS leases count into it (core/quota_lease.py)
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

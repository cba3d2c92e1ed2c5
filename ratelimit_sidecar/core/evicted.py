"""What evicted keys had counted, so that eviction can never be used to reset a counter.

A client that varies a descriptor value fills the key table and gets other keys evicted. If an
evicted key's count were simply forgotten, a heavy client could reset its own counter that way.
Instead, every eviction records the key's count in its current window (which includes what it
resumed from, if it was evicted before) in a sketch for that window, and a key that comes back
in the same window resumes from the sketch's estimate.

The sketch is a count-min sketch that keeps maxima instead of sums: each of its DEPTH rows
raises the key's cell to the recorded count, and the estimate is the smallest of the key's
cells. Every cell holds at least the count of every key that maps to it, so the estimate never
under-counts. It may over-count (another key with a larger count shares a cell in every row),
which only makes a returning key stricter. Memory is fixed: one sketch per window length in
use, DEPTH x WIDTH cells, made on the first eviction and emptied when its window ends.
"""

from __future__ import annotations

from array import array

from ratelimit_sidecar.core.types import KeyId

WIDTH_BITS = 16
WIDTH = 1 << WIDTH_BITS
DEPTH = 4
CELL_MAX = 2**32 - 1  # cells are unsigned 32-bit: 4 x 65,536 x 4 bytes = 1 MiB per sketch
_MASK64 = 2**64 - 1
# Odd multipliers of a multiply-shift hash, one per row (from the 64-bit golden ratio).
_MULTIPLIERS = tuple((0x9E3779B97F4A7C15 * (2 * row + 1)) & _MASK64 | 1 for row in range(DEPTH))


class EvictedCounts:
    """Per window length, a sketch of what keys evicted in the current window had counted."""

    __slots__ = ("_sketches",)

    def __init__(self) -> None:
        self._sketches: dict[int, tuple[int, list[array[int]]]] = {}  # window_ms -> ordinal, rows

    def record(self, key: KeyId, window_ms: int, window: int, count: int) -> None:
        """An evicted key had counted `count` in all in window ordinal `window`."""
        if count <= 0:
            return
        rows = self._rows(window_ms, window, create=True)
        if rows is None:  # a window that already ended: nobody will ask for it again
            return
        count = min(count, CELL_MAX)
        for row, cell in zip(rows, _cells(key), strict=True):
            row[cell] = max(row[cell], count)

    def estimate(self, key: KeyId, window_ms: int, window: int) -> int:
        """At least what `key` had counted in `window` before it was evicted; 0 if nothing."""
        rows = self._rows(window_ms, window, create=False)
        if rows is None:
            return 0
        return min(row[c] for row, c in zip(rows, _cells(key), strict=True))

    def _rows(self, window_ms: int, window: int, *, create: bool) -> list[array[int]] | None:
        found = self._sketches.get(window_ms)
        if found is not None and found[0] == window:
            return found[1]
        if found is not None and found[0] > window:
            return None
        if not create:
            return None
        rows = [array("I", bytes(4 * WIDTH)) for _ in range(DEPTH)]
        self._sketches[window_ms] = (window, rows)
        return rows


def _cells(key: KeyId) -> list[int]:
    """One cell per row. Python's string hash is salted per process: an attacker cannot aim
    a value at another key's cells from outside."""
    h = hash(key) & _MASK64
    return [((h * m) & _MASK64) >> (64 - WIDTH_BITS) for m in _MULTIPLIERS]

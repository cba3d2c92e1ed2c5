"""What evicted keys had counted, so that eviction can never be used to reset a counter.

A client that varies a descriptor value fills the key table and gets other keys evicted. If an
evicted key's count were simply forgotten, a heavy client could reset its own counter that way.
Instead, an eviction records the key's count in its current window (which includes what it
resumed from, if it was evicted before), and a key that comes back under the same limit in the
same window resumes from its own record. Records are exact, per key and limit (by a 64-bit hash
of both), so a flood cannot make another key look busier than it was.

Memory is bounded at `capacity` records (about 150 bytes each). When full, a record of an ended
window makes room if one is among the `PROBES` oldest, else the one with the smallest count
among them; the others go to the back. To get a heavy key's record dropped, an attacker would
first have to fill the records with keys that each counted at least as much: many times the
quota the reset would win back.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit
from ratelimit_sidecar.core.types import KeyId

PROBES = 16


class EvictedCounts:
    """Counts of evicted keys in their current window, per limit."""

    __slots__ = ("_capacity", "_records")

    def __init__(self, capacity: int) -> None:
        self._capacity = max(1, capacity)
        # hash((key, limit)) -> (limit, window ordinal, count)
        self._records: OrderedDict[int, tuple[RateLimit, int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def record(self, key: KeyId, limit: RateLimit, count: int, now_ms: int) -> None:
        """An evicted key had counted `count` in all in the current window of `limit`."""
        if count <= 0:
            return
        name = hash((key, limit))
        if name not in self._records and len(self._records) >= self._capacity:
            self._make_room(now_ms)
        self._records[name] = (limit, now_ms // limit.window_ms, count)
        self._records.move_to_end(name)

    def estimate(self, key: KeyId, limit: RateLimit, window: int) -> int:
        """What `key` had counted under `limit` in `window` when it was evicted; 0 if none."""
        if not self._records:
            return 0
        found = self._records.get(hash((key, limit)))
        if found is None or not 0 <= window - found[1] <= lasting_windows(limit):
            return 0
        return found[2]

    def _make_room(self, now_ms: int) -> None:
        oldest = list(islice(self._records.items(), PROBES))
        for name, (limit, window, _) in oldest:
            if now_ms // limit.window_ms - window > lasting_windows(limit):  # worth nothing
                del self._records[name]
                return
        smallest = min(oldest, key=lambda item: item[1][2])[0]
        del self._records[smallest]
        for name, _ in oldest:  # a second chance for the larger ones
            if name != smallest:
                self._records.move_to_end(name)


def lasting_windows(limit: RateLimit) -> int:
    """How many windows after its own a count still matters: none for a fixed window; one for
    the others, whose trailing window (or bucket's debt) reaches into the next window. A
    record read in that next window over-counts (it is as of the eviction), never under."""
    return 0 if limit.algorithm is AlgorithmName.FIXED_WINDOW else 1

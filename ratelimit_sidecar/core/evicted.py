"""What evicted keys had counted, so that eviction can never reset a counter.

A client varying a descriptor value fills the key table and gets other keys evicted; forgetting
their counts would let a heavy client reset its own. An eviction records the key's count in its
window (resumed counts included) and the key, back under the same limit in the same window, resumes
from it. Records are exact per key and limit (a 64-bit hash of both), so a flood cannot make another
key look busier.

At most `capacity` records (~150 bytes each). When full, an ended window's record among the `PROBES`
oldest makes room, else the smallest count among them; the others go to the back. Dropping a heavy
key's record takes filling the records with keys that each counted as much: many times the quota won
back.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit
from ratelimit_sidecar.core.types import KeyId

PROBES = 16


class EvictedCounts:
    __slots__ = ("_capacity", "_records")

    def __init__(self, capacity: int) -> None:
        self._capacity = max(1, capacity)
        # hash((key, limit)) -> (limit, window ordinal, count)
        self._records: OrderedDict[int, tuple[RateLimit, int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def record(self, key: KeyId, limit: RateLimit, count: int, now_ms: int) -> None:
        if count <= 0:
            return
        name = hash((key, limit))
        if name not in self._records and len(self._records) >= self._capacity:
            self._make_room(now_ms)
        self._records[name] = (limit, now_ms // limit.window_ms, count)
        self._records.move_to_end(name)

    def estimate(self, key: KeyId, limit: RateLimit, window: int) -> int:
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
    """Windows after its own a count still matters: none for a fixed window; one for the others,
    whose trailing window (or bucket debt) reaches into the next (over-counting there, never under).
    """
    return 0 if limit.algorithm is AlgorithmName.FIXED_WINDOW else 1

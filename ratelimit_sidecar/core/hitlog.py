"""The times of a key's admitted hits in its trailing window, oldest first (a sliding log).

Hits of one millisecond share an entry; two deques of ints cost about 50 bytes an entry, and the log
never holds more than MAX entries.
"""

from __future__ import annotations

from collections import deque


class HitLog:
    __slots__ = ("capacity", "counts", "times", "total")

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.times: deque[int] = deque()
        self.counts: deque[int] = deque()
        self.total = 0

    def expire(self, oldest_kept_ms: int) -> None:
        times, counts = self.times, self.counts
        while times and times[0] < oldest_kept_ms:
            times.popleft()
            self.total -= counts.popleft()

    def add(self, now_ms: int, count: int) -> None:
        """Only hits counted over the limit (a shadow rule's) can outnumber MAX entries: then the
        two oldest merge at the later time, over-counting for a while instead of growing without
        bound."""
        if self.times and self.times[-1] == now_ms:
            self.counts[-1] += count
        else:
            self.times.append(now_ms)
            self.counts.append(count)
        self.total += count
        if len(self.times) > self.capacity:
            self.times.popleft()
            oldest = self.counts.popleft()
            self.counts[0] += oldest

    def take_newest(self, count: int) -> int:
        removed = 0
        while self.times and removed < count:
            taken = min(self.counts[-1], count - removed)
            self.counts[-1] -= taken
            removed += taken
            if self.counts[-1] == 0:
                self.times.pop()
                self.counts.pop()
        self.total -= removed
        return removed

    def time_freeing(self, count: int) -> int:
        """The time of the entry whose leaving frees `count` in all (at most the total)."""
        freed = 0
        for time, held in zip(self.times, self.counts, strict=True):
            freed += held
            if freed >= count:
                return time
        raise ValueError(f"the log holds {self.total} hits, not {count}")

"""The sliding log, exactly: at most MAX admitted hits in any trailing window (now - W, now]."""

from __future__ import annotations

from bisect import bisect_right


class ExactSlidingLog:
    def __init__(self, max_hits: int, window_ms: int) -> None:
        self.max_hits, self.window_ms = max_hits, window_ms
        self.times: list[int] = []  # one entry per admitted hit, in order

    def count(self, now: int) -> int:
        """Admitted hits at times t with now - W < t <= now."""
        return bisect_right(self.times, now) - bisect_right(self.times, now - self.window_ms)

    def allows(self, now: int, hits: int) -> bool:
        return self.count(now) + hits <= self.max_hits

    def hit(self, now: int, hits: int = 1) -> bool:
        """Decide a request at `now` (not before the last one) and log it if admitted."""
        admitted = self.allows(now, hits)
        if admitted:
            self.times.extend([now] * max(0, hits))
        return admitted

    def wait_ms(self, now: int, hits: int) -> int | None:
        """The shortest wait after which `hits` are admitted if nobody sends more; None if
        they never are. Tried millisecond by millisecond: within a window every hit has left."""
        if hits > self.max_hits:
            return None
        return next(d for d in range(self.window_ms + 1) if self.allows(now + d, hits))

    def reset_ms(self, now: int) -> int:
        """Until the oldest hit in the trailing window leaves it; 0 if there is none."""
        first = bisect_right(self.times, now - self.window_ms)
        if first >= bisect_right(self.times, now):
            return 0
        return self.times[first] + self.window_ms - now

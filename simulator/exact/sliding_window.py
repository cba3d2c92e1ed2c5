"""The span-weighted sliding window, exactly, from the full log of admitted hits.

Windows of W ms are cut into N spans on the epoch: span k of a window starting at w0 holds the
milliseconds [w0 + ceil(k W / N), w0 + ceil((k + 1) W / N)). At `now`, an admitted hit counts

- 1 if its span starts after now - W (as much of the span as has happened is in the trailing
  window (now - W, now]);
- overlap / length if its span holds the instant now - W, where overlap is the number of the
  span's milliseconds after now - W and length the span's;
- 0 otherwise.

A request of n hits is admitted iff the count plus n is at most MAX. Counts are Fractions, so
nothing is rounded.
"""

from __future__ import annotations

from bisect import bisect_right
from fractions import Fraction


class ExactSlidingWindow:
    def __init__(self, max_hits: int, window_ms: int, spans: int) -> None:
        self.max_hits, self.window_ms, self.spans = max_hits, window_ms, spans
        self.times: list[int] = []  # of admitted hits, in order (one entry per request)
        self.hits: list[int] = []

    def span_of(self, t: int) -> tuple[int, int]:
        """The first millisecond of the span holding `t`, and the first one after it."""
        w, n = self.window_ms, self.spans
        window_start = t - t % w
        k = (t % w) * n // w
        return window_start + -(-k * w // n), window_start + -(-(k + 1) * w // n)

    def weight(self, t: int, now: int) -> Fraction:
        start, end = self.span_of(t)
        edge = now - self.window_ms
        if start > edge:
            return Fraction(1)
        if end - 1 <= edge:
            return Fraction(0)
        return Fraction(end - 1 - edge, end - start)

    def _recent(self, now: int) -> range:
        """Indexes of the logged hits that may still count at `now` or later."""
        first = bisect_right(self.times, now - 2 * self.window_ms)
        return range(first, bisect_right(self.times, now))

    def count(self, now: int) -> Fraction:
        """The logged hits, weighted: all hits of a span weigh the same, so by span."""
        per_span: dict[int, int] = {}  # first ms of a span -> its hits
        for i in self._recent(now):
            start = self.span_of(self.times[i])[0]
            per_span[start] = per_span.get(start, 0) + self.hits[i]
        return sum(
            (hits * self.weight(start, now) for start, hits in per_span.items()), Fraction(0)
        )

    def allows(self, now: int, hits: int) -> bool:
        return self.count(now) + hits <= self.max_hits

    def hit(self, now: int, hits: int = 1) -> bool:
        """Decide a request at `now` (not before the last one) and log it if admitted."""
        admitted = self.allows(now, hits)
        if admitted and hits:
            self.times.append(now)
            self.hits.append(hits)
        return admitted

    def wait_ms(self, now: int, hits: int) -> int | None:
        """The shortest wait after which `hits` are admitted if nobody sends more; None if
        they never are. Without new hits the count only falls as time passes, so a binary
        search over the wait finds the first moment it fits."""
        if hits > self.max_hits:
            return None
        low, high = 0, 3 * self.window_ms  # by then every logged hit has left
        while low < high:
            middle = (low + high) // 2
            if self.allows(now + middle, hits):
                high = middle
            else:
                low = middle + 1
        return low

    def reset_ms(self, now: int) -> int:
        """Until the oldest hit that still counts stops counting (its span leaves); 0 if none."""
        counting = [i for i in self._recent(now) if self.weight(self.times[i], now) > 0]
        if not counting:
            return 0
        _, end = self.span_of(self.times[counting[0]])
        return end - 1 + self.window_ms - now

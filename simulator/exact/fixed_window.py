"""The fixed window with its cooldown, exactly: windows of W ms on the epoch, at most MAX
admitted hits in each; a request that would take its window past MAX is refused and blocks the
key for the cooldown (or, with `cooldown: window_end`, until its window ends)."""

from __future__ import annotations


class ExactFixedWindow:
    def __init__(self, max_hits: int, window_ms: int, cooldown_ms: int | None) -> None:
        """`cooldown_ms` None: a block ends with its window (`cooldown: window_end`)."""
        self.max_hits, self.window_ms, self.cooldown_ms = max_hits, window_ms, cooldown_ms
        self.counts: dict[int, int] = {}  # window ordinal -> admitted hits
        self.blocked_until = 0

    def hit(self, now: int, hits: int = 1) -> bool:
        """Decide a request at `now` and count it if admitted."""
        if now < self.blocked_until:
            return False
        window = now // self.window_ms
        if self.counts.get(window, 0) + hits > self.max_hits:
            self.blocked_until = self._block_end(now, window)
            return False
        self.counts[window] = self.counts.get(window, 0) + hits
        return True

    def _block_end(self, now: int, window: int) -> int:
        if self.cooldown_ms is None:
            return (window + 1) * self.window_ms
        return now + self.cooldown_ms

"""When a node talks to the shared store: one schedule, for the server's loop and the simulator.

A node syncs at start, then at the next span end of any tracked rule, and at least a heartbeat
after its last sync, never overlapping the previous one. The store call times out after the
configured timeout plus an allowance per key, never after half the shortest span: a slow store
turns into the fallback, never a late span, and a large sync is not cut short for its size.
A shutdown flush tries a few times before it counts what is left as lost.
"""

from __future__ import annotations

HEARTBEAT_MS = 1000  # sync at least this often (a sync with nothing to send sends nothing)
# The heartbeat goes once per span of the shortest tracked rule (the live node count follows the
# fleet as fast as the counts), within [HEARTBEAT_MS, a third of the node set's default TTL].
BEAT_MS = 10_000
POLL_MS = 250  # a loop that cannot be told of a new key looks again this often
FLUSH_ATTEMPTS = 3
MIN_TIMEOUT_MS = 10
DEFAULT_TIMEOUT_MS = 250
# Redis's time per key of a sync (`bench redis-sync`), with a margin.
TIMEOUT_PER_KEY_US = 20


class SyncSchedule:
    __slots__ = ("beat_ms", "due_ms", "heartbeat_ms", "start_ms", "timeout_ms")

    def __init__(
        self, start_ms: int, timeout_ms: int = DEFAULT_TIMEOUT_MS, heartbeat_ms: int = HEARTBEAT_MS
    ) -> None:
        self.due_ms = self.start_ms = start_ms  # the first sync is at once
        self.timeout_ms = timeout_ms
        self.heartbeat_ms = heartbeat_ms
        self.beat_ms: int | None = None  # when the last sync carrying the heartbeat started

    def heartbeat_due(self, now_ms: int, shortest_span_ms: int | None = None) -> bool:
        period = min(max(shortest_span_ms or BEAT_MS, self.heartbeat_ms), BEAT_MS)
        if now_ms - self.start_ms < BEAT_MS:  # nodes started together count each other at once
            period = self.heartbeat_ms
        if self.beat_ms is not None and now_ms - self.beat_ms < period:
            return False
        self.beat_ms = now_ms
        return True

    def next_sync(self, span_end_ms: int | None) -> int:
        """A span end once seen stays due after it passes: its sync is never skipped."""
        if span_end_ms is not None and span_end_ms < self.due_ms:
            self.due_ms = span_end_ms
        return self.due_ms

    def synced(self, now_ms: int) -> None:
        self.due_ms = now_ms + self.heartbeat_ms

    def store_timeout_ms(self, shortest_span_ms: int | None, keys: int = 0) -> int:
        timeout = self.timeout_ms + keys * TIMEOUT_PER_KEY_US // 1000
        if shortest_span_ms is not None:
            timeout = min(timeout, shortest_span_ms // 2)
        return max(timeout, MIN_TIMEOUT_MS)

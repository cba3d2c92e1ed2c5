"""When a node talks to the shared store: one schedule, for the server's loop and the simulator.

A node syncs once at start, then at the next span end of any tracked rule, and at least once a
heartbeat after its last sync, so its heartbeat in the store stays fresh while it is idle. A
sync never overlaps the previous one. Its store call times out after the configured timeout plus
an allowance per key it carries, and never after more than half the shortest span, so a slow
store turns into the fallback, never into a late span, while a large sync is not cut short for
its size alone. A shutdown flush tries a few times before it counts what is left as lost.
"""

from __future__ import annotations

HEARTBEAT_MS = 1000  # sync at least this often (a sync with nothing to send sends nothing)
# The heartbeat (one command) goes once per span of the shortest tracked rule, at least this
# often (a third of the node set's default TTL, storage/redis_store.py) and at most once a
# HEARTBEAT_MS: the live node count follows the fleet as fast as the counts do.
BEAT_MS = 10_000
POLL_MS = 250  # a loop that cannot be told of a new key looks again this often
FLUSH_ATTEMPTS = 3
MIN_TIMEOUT_MS = 10
DEFAULT_TIMEOUT_MS = 250
# Redis's time per key of a sync (`bench redis-sync`), with a margin: a large sync gets this
# much more time, so its size alone never makes it time out.
TIMEOUT_PER_KEY_US = 20


class SyncSchedule:
    """The next sync time of one node, on whatever clock the caller passes in."""

    __slots__ = ("beat_ms", "due_ms", "heartbeat_ms", "timeout_ms")

    def __init__(
        self,
        start_ms: int,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        heartbeat_ms: int = HEARTBEAT_MS,
    ) -> None:
        self.due_ms = start_ms  # the first sync is at once
        self.timeout_ms = timeout_ms
        self.heartbeat_ms = heartbeat_ms
        self.beat_ms: int | None = None  # when the last sync carrying the heartbeat started

    def heartbeat_due(self, now_ms: int, shortest_span_ms: int | None = None) -> bool:
        """Whether the sync starting now carries the heartbeat: the first one, then one per
        span of the shortest tracked rule, within [HEARTBEAT_MS, BEAT_MS]."""
        period = min(max(shortest_span_ms or BEAT_MS, self.heartbeat_ms), BEAT_MS)
        if self.beat_ms is not None and now_ms - self.beat_ms < period:
            return False
        self.beat_ms = now_ms
        return True

    def next_sync(self, span_end_ms: int | None) -> int:
        """When to sync next, given the next span end of the tracked rules (None: none).

        A span end once seen stays due even after it passes: the sync it calls for is never
        skipped because the caller looked again later."""
        if span_end_ms is not None and span_end_ms < self.due_ms:
            self.due_ms = span_end_ms
        return self.due_ms

    def synced(self, now_ms: int) -> None:
        """A sync finished at `now_ms`: the next is due a heartbeat later, or at a span end."""
        self.due_ms = now_ms + self.heartbeat_ms

    def store_timeout_ms(self, shortest_span_ms: int | None, keys: int = 0) -> int:
        """The store call's timeout for a sync of `keys` keys: the configured one plus an
        allowance per key, capped at half the shortest span."""
        timeout = self.timeout_ms + keys * TIMEOUT_PER_KEY_US // 1000
        if shortest_span_ms is not None:
            timeout = min(timeout, shortest_span_ms // 2)
        return max(timeout, MIN_TIMEOUT_MS)

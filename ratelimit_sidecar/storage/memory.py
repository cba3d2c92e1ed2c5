"""An in-process store: the single-node (local-only) mode, and the simulator's shared store."""

from __future__ import annotations

from collections.abc import Callable

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core.types import KeyId, PushResult, SyncBatch, SyncResult

PURGE_EVERY = 64  # batches between sweeps of expired counters


class MemoryStorage:
    """Counters and block flags in a dict, with the same semantics as the Redis store (it never
    fails a single key: every push is applied).

    `clock` gives the store's own time in ms (the simulator's true time); without one the
    batch's `now_ms` is used, which is right when a single node owns the store.
    """

    def __init__(self, clock: Callable[[], int] | None = None, node_ttl_ms: int = 0) -> None:
        self._clock = clock
        self._counters: dict[tuple[KeyId, int], tuple[int, int]] = {}  # -> (value, expires)
        self._flags: dict[KeyId, int] = {}  # -> expires
        self._nodes: dict[str, int] = {}  # node id -> last heartbeat
        self._node_ttl_ms = node_ttl_ms
        self.round_trips = 0

    @property
    def description(self) -> str:
        return "memory (local-only)"

    async def sync(self, batch: SyncBatch) -> SyncResult:
        return self.execute(batch)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None

    def execute(self, batch: SyncBatch, node_id: str = "") -> SyncResult:
        """Apply a batch synchronously."""
        now = self._clock() if self._clock is not None else batch.now_ms
        self.round_trips += 1
        if self.round_trips % PURGE_EVERY == 0:
            self._purge(now)
        pushes = tuple(self._push(p.key, p.window, p.count, p.limit, now) for p in batch.pushes)
        totals = tuple(self._total(r.key, r.window, now) for r in batch.total_reads)
        store_time = now if self._clock is not None else 0  # without a clock of its own: none
        return SyncResult(pushes, totals, self._heartbeat(node_id, now), store_time)

    def _push(self, key: KeyId, window: int, count: int, limit: RateLimit, now: int) -> PushResult:
        value = self._total(key, window, now) + count
        self._counters[(key, window)] = (value, now + 2 * limit.window_ms)
        if value > limit.requests_per_unit and self._flag_ms(key, now) == 0:
            self._flags[key] = now + limit.cooldown
        return PushResult(value, self._flag_ms(key, now))

    def _total(self, key: KeyId, window: int, now: int) -> int:
        value, expires = self._counters.get((key, window), (0, 0))
        return value if now < expires else 0

    def _flag_ms(self, key: KeyId, now: int) -> int:
        return max(0, self._flags.get(key, 0) - now)

    def _heartbeat(self, node_id: str, now: int) -> int:
        if not node_id or not self._node_ttl_ms:
            return 0
        self._nodes[node_id] = now
        self._nodes = {n: t for n, t in self._nodes.items() if now - t < self._node_ttl_ms}
        return len(self._nodes)

    def _purge(self, now: int) -> None:
        self._counters = {k: v for k, v in self._counters.items() if now < v[1]}
        self._flags = {k: t for k, t in self._flags.items() if now < t}

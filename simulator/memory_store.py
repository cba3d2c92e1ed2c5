"""The in-process store: the simulator's shared store, and the reference the storage contract
tests hold the Redis scripts to (storage/shared_rules.py is the arithmetic both follow)."""

from __future__ import annotations

from collections.abc import Callable

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit
from ratelimit_sidecar.core.types import KeyId, Push, PushResult, SyncBatch, SyncResult
from ratelimit_sidecar.storage import shared_rules as rules
from simulator.memory_penalty import Penalties

PURGE_EVERY = 64  # batches between sweeps of expired counters
UNSYNCABLE = "sliding_log is never synced per span"  # a push the config should have refused
CounterName = tuple[KeyId, int | str]  # (key, window) or (key, "s<span>"), as in Redis


class MemoryStorage:
    """Counters, token bucket TATs and block flags in dicts, with the same semantics as the Redis
    store (storage/shared_rules.py); it fails a single key only for a sliding log push.

    `clock` gives the store's own time in ms (the simulator's true time); without one the
    batch's `now_ms` is used, which is right when a single node owns the store.
    """

    def __init__(self, clock: Callable[[], int] | None = None, node_ttl_ms: int = 0) -> None:
        self._clock = clock
        self._counters: dict[CounterName, tuple[int, int]] = {}  # -> (value, expires)
        self._buckets: dict[KeyId, tuple[float, int]] = {}  # -> (TAT, expires)
        self._flags: dict[KeyId, tuple[int, int]] = {}  # -> (expires, requests it was set for)
        self._penalties = Penalties()  # levels and their blocks' levels (sync_common.lua)
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
        pushes = tuple(self._push(p, now) for p in batch.pushes)
        totals = tuple(self._value((r.key, r.window), now) for r in batch.total_reads)
        store_time = now if self._clock is not None else 0  # without a clock of its own: none
        return SyncResult(pushes, totals, self._heartbeat(node_id, now), store_time)

    def _push(self, push: Push, now: int) -> PushResult:
        algorithm = push.limit.algorithm
        if algorithm is AlgorithmName.SLIDING_LOG:
            return PushResult(0, 0, error=UNSYNCABLE)
        window_ttl = rules.window_ttl_ms(push.limit)
        window_total = self._add((push.key, push.window), push.hits, window_ttl, now)
        spans: tuple[int, ...] = ()
        if algorithm is AlgorithmName.SLIDING_WINDOW:
            spans = self._spans(push, now)
            total = sum(spans)
        elif algorithm is AlgorithmName.TOKEN_BUCKET:
            total = self._bucket(push, now)
        else:
            total = window_total
        if push.limit.penalty is not None:
            return self._penalties.push(push, total, spans, now)
        return PushResult(total, self._flag(push.key, push.limit, total, now), spans=spans)

    def _spans(self, push: Push, now: int) -> tuple[int, ...]:
        """INCRBY the pushed span; the window of span totals ending with it, oldest first."""
        span = rules.pushed_span(push)
        self._add((push.key, f"s{span}"), push.hits, rules.span_ttl_ms(push.limit), now)
        window = rules.answered_spans(span, push.limit)
        return tuple(self._value((push.key, f"s{n}"), now) for n in window)

    def _bucket(self, push: Push, now: int) -> int:
        """Move the TAT by the push; answer the debt in ms."""
        tat, expires = self._buckets.get(push.key, (0.0, 0))
        tat = rules.next_tat(tat if now < expires else 0.0, now, push.hits, push.limit)
        if push.hits:  # a read leaves the state as it is (see sync_bucket.lua)
            self._buckets[push.key] = (tat, now + rules.bucket_ttl_ms(tat, now))
        return rules.bucket_debt_ms(tat, now)

    def _add(self, name: CounterName, count: int, ttl_ms: int, now: int) -> int:
        value = self._value(name, now) + count
        self._counters[name] = (value, now + ttl_ms)
        return value

    def _value(self, name: CounterName, now: int) -> int:
        value, expires = self._counters.get(name, (0, 0))
        return value if now < expires else 0

    def _flag(self, key: KeyId, limit: RateLimit, total: int, now: int) -> int:
        """The block flag's ms left, set first (NX) if `total` crosses the limit."""
        if not limit.cooldown:
            return 0  # no flag for this limit (rules.blocks)
        expires, set_for = self._flags.get(key, (0, 0))
        if expires > now and rules.lifted(set_for, limit):  # raised since: deleted
            del self._flags[key]
            expires = 0
        if rules.blocks(limit, total) and expires <= now:
            expires = now + limit.cooldown
            self._flags[key] = (expires, limit.requests_per_unit)
        return max(0, expires - now)

    def _heartbeat(self, node_id: str, now: int) -> int:
        if not node_id or not self._node_ttl_ms:
            return 0
        self._nodes[node_id] = now
        self._nodes = {n: t for n, t in self._nodes.items() if now - t < self._node_ttl_ms}
        return len(self._nodes)

    def _purge(self, now: int) -> None:
        self._counters = {k: v for k, v in self._counters.items() if now < v[1]}
        self._buckets = {k: v for k, v in self._buckets.items() if now < v[1]}
        self._flags = {k: v for k, v in self._flags.items() if now < v[0]}
        self._penalties.purge(now)

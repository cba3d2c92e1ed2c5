"""How the sync loop treats each kind of store failure: a batch that may have been applied is
never sent again; one that surely was not is kept for the next sync; the loop never dies."""

from __future__ import annotations

import asyncio

import pytest

from ratelimit_sidecar.core import FleetLimiter, PushResult, SyncBatch, SyncResult
from ratelimit_sidecar.storage.errors import (
    StoreLost,
    StoreRefused,
    StoreTimeout,
    StoreUnavailable,
)
from ratelimit_sidecar.storage.keys import digest
from ratelimit_sidecar.sync.span_sync import SyncLoop
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000


class FailingStore:
    description = "test store"

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def sync(self, batch: SyncBatch) -> SyncResult:
        raise self.error

    async def ping(self) -> bool:
        return False

    async def close(self) -> None:
        return None


@pytest.mark.parametrize(
    ("error", "kind", "kept"),
    [
        (StoreTimeout("late"), "timeout", 0),  # may have been applied: never resent
        (StoreUnavailable("refused"), "connection", 3),  # surely not applied: resent later
        (StoreLost("closed after sending"), "connection", 0),  # may have been applied
        (StoreRefused("READONLY"), "refused", 3),
        (RuntimeError("a storage bug"), "other", 3),  # still the fallback, not a dead loop
    ],
)
async def test_a_failed_sync_falls_back_and_resends_only_what_surely_did_not_arrive(
    error: Exception, kind: str, kept: int
) -> None:
    limiter, now = FleetLimiter(), [T0]
    limiter.hit(T0, [hit(rule(rpu=100), hits=3)])
    loop = SyncLoop(limiter, FailingStore(error), lambda: now[0])
    now[0] = T0 + 500  # the span ended
    stats = await loop.sync_once()
    assert stats.failed and not loop.store_up and loop.last_error == kind
    assert limiter.pending_hits() == kept
    assert stats.dropped_hits == 3 - kept


class HangingStore(FailingStore):
    async def sync(self, batch: SyncBatch) -> SyncResult:
        await asyncio.Event().wait()  # never answers
        raise AssertionError("unreachable")


async def test_a_store_past_the_loops_own_deadline_counts_as_a_timeout() -> None:
    limiter, now = FleetLimiter(), [T0]
    limiter.hit(T0, [hit(rule(rpu=100), hits=2)])
    loop = SyncLoop(limiter, HangingStore(RuntimeError()), lambda: now[0], timeout_ms=10)
    now[0] = T0 + 500
    stats = await loop.sync_once()
    assert stats.failed and loop.last_error == "timeout"
    assert limiter.pending_hits() == 0 and stats.dropped_hits == 2  # may have been applied


class PartlyRefusingStore(FailingStore):
    """Answers every sync, refusing the pushes of the keys whose value is in `failing`."""

    def __init__(self) -> None:
        super().__init__(RuntimeError())
        self.failing: set[str] = set()

    async def sync(self, batch: SyncBatch) -> SyncResult:
        pushes = tuple(
            PushResult(0, 0, "WRONGTYPE bad key") if p.key[2] in self.failing else PushResult(1, 0)
            for p in batch.pushes
        )
        return SyncResult(pushes, tuple(0 for _ in batch.total_reads), 1, 0)


async def test_keys_the_store_refused_are_reported_while_the_store_stays_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limiter, now, store = FleetLimiter(), [T0], PartlyRefusingStore()
    reported: list[int] = []
    loop = SyncLoop(
        limiter, store, lambda: now[0], on_sync=lambda s, _t, _k: reported.append(s.failed_keys)
    )
    store.failing = {"secret-a", "secret-b"}
    for step in range(1, 5):  # four spans of 500 ms with two bad keys, then none
        for value in ("secret-a", "secret-b", "fine"):
            limiter.hit(now[0], [hit(rule(rpu=100), value)])
        now[0] = T0 + step * 500
        if step == 4:
            store.failing = set()
        await loop.sync_once()
        assert loop.store_up and loop.last_error == ""
        assert loop.key_errors == (2 if step < 4 else 0)
    assert reported == [2, 2, 2, 0]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    # At most one line per KEY_LOG_EVERY_MS (10 s here: only the first sync), naming the keys
    # by digest, never by value.
    assert len(warnings) == 1, warnings
    assert "apply 2 keys" in warnings[0] and digest(hit(rule(), "secret-a").key) in warnings[0]
    assert "secret" not in warnings[0]
    assert limiter.pending_hits() == 0  # everything the store refused was resent and applied


class CountingStore:
    """Answers every push; records each batch it was sent."""

    description = "counting store"

    def __init__(self) -> None:
        self.batches: list[SyncBatch] = []

    async def sync(self, batch: SyncBatch) -> SyncResult:
        self.batches.append(batch)
        return SyncResult(tuple(PushResult(p.hits, 0) for p in batch.pushes), live_nodes=4)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None


async def test_an_asleep_loop_stops_at_once_and_wakes_at_once_for_an_early_push() -> None:
    limiter, store, now = FleetLimiter(), CountingStore(), [T0]
    loop = SyncLoop(limiter, store, lambda: now[0])  # a clock that never moves by itself
    runner = asyncio.create_task(loop.run())
    await asyncio.sleep(0.05)
    assert len(store.batches) == 1 and store.batches[0].heartbeat  # the first sync, then asleep
    ten = rule(rpu=8)
    for _ in range(3):  # 8 / 4 live nodes = 2: the third hit asks for a push now
        limiter.hit(now[0], [hit(ten)])
    await asyncio.sleep(0.05)
    assert [p.hits for b in store.batches[1:] for p in b.pushes] == [3]
    assert not store.batches[1].heartbeat  # one heartbeat per period, not per sync
    loop.stop()
    await asyncio.wait_for(runner, 1.0)

"""How the sync loop treats each kind of store failure: a batch that may have been applied is
never sent again; one that surely was not is kept for the next sync; the loop never dies."""

from __future__ import annotations

import asyncio

import pytest

from ratelimit_sidecar.core import FleetLimiter, SyncBatch, SyncResult
from ratelimit_sidecar.server.syncloop import SyncLoop
from ratelimit_sidecar.storage.errors import StoreRefused, StoreTimeout, StoreUnavailable
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

"""The sync schedule: at start, at span ends, at least once a heartbeat; timeouts fit a span."""

from __future__ import annotations

from ratelimit_sidecar.core import SyncSchedule
from ratelimit_sidecar.core.schedule import HEARTBEAT_MS, MIN_TIMEOUT_MS, TIMEOUT_PER_KEY_US

T0 = 1_700_000_040_000


def test_the_first_sync_is_at_once_then_a_heartbeat_later_without_span_ends() -> None:
    schedule = SyncSchedule(T0)
    assert schedule.next_sync(None) == T0
    schedule.synced(T0 + 3)
    assert schedule.next_sync(None) == T0 + 3 + HEARTBEAT_MS


def test_a_span_end_before_the_heartbeat_comes_first_and_stays_due() -> None:
    schedule = SyncSchedule(T0)
    schedule.synced(T0)
    assert schedule.next_sync(T0 + 250) == T0 + 250
    # Looked at again after that span end passed: the next span end is later, but the sync
    # for the one that passed must not be skipped.
    assert schedule.next_sync(T0 + 500) == T0 + 250
    schedule.synced(T0 + 260)
    assert schedule.next_sync(T0 + 500) == T0 + 500


def test_the_store_timeout_is_capped_at_half_the_shortest_span() -> None:
    schedule = SyncSchedule(T0, timeout_ms=250)
    assert schedule.store_timeout_ms(None) == 250
    assert schedule.store_timeout_ms(1000) == 250
    assert schedule.store_timeout_ms(200) == 100
    assert schedule.store_timeout_ms(4) == MIN_TIMEOUT_MS


def test_a_large_sync_gets_time_for_its_keys_within_half_a_span() -> None:
    schedule = SyncSchedule(T0, timeout_ms=250)
    assert (
        schedule.store_timeout_ms(10_000, keys=50_000) == 250 + 50_000 * TIMEOUT_PER_KEY_US // 1000
    )
    assert schedule.store_timeout_ms(1_000, keys=50_000) == 500  # never past half a span

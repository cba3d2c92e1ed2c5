"""The span clock follows the store's clock, compensated by half the round trip."""

from __future__ import annotations

from ratelimit_sidecar.sync.store_clock import SAMPLES, StoreClock


class FakeClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_local_clock_until_the_store_has_answered() -> None:
    local = FakeClock(1_000)
    clock = StoreClock(local)
    assert clock.now_ms() == 1_000
    clock.observe(1_000, 1_000, 0)  # a store that does not report its time changes nothing
    assert clock.now_ms() == 1_000


def test_offset_is_the_store_time_plus_half_the_round_trip() -> None:
    local = FakeClock(50_000)
    clock = StoreClock(local)
    # sent at 49_980, answered at 50_000 (20 ms round trip); the store read TIME at 7_010
    clock.observe(49_980, 50_000, 7_010)
    assert clock.offset_ms == 7_010 + 10 - 50_000
    assert clock.now_ms() == 7_020
    local.now += 500
    assert clock.now_ms() == 7_520


def test_the_shortest_recent_round_trip_wins() -> None:
    local = FakeClock(10_000)
    clock = StoreClock(local)
    clock.observe(9_998, 10_000, 20_000)  # 2 ms round trip: offset 10_001
    clock.observe(9_800, 10_000, 20_300)  # a slow answer (200 ms): less trustworthy
    assert clock.offset_ms == 10_001
    for _ in range(SAMPLES):  # once the good sample is old, newer ones take over
        clock.observe(9_996, 10_000, 20_010)
    assert clock.offset_ms == 10_012


def test_the_clock_never_goes_back_when_the_offset_shrinks() -> None:
    local = FakeClock(1_000)
    clock = StoreClock(local)
    clock.observe(1_000, 1_000, 5_000)
    assert clock.now_ms() == 5_000
    clock.observe(1_000, 1_000, 4_900)  # the store says we were 100 ms ahead
    assert clock.offset_ms == 3_900
    assert clock.now_ms() == 5_000  # held until the corrected clock catches up
    local.now += 150
    assert clock.now_ms() == 5_050

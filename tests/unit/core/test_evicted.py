"""Eviction cannot reset a counter: what an evicted key counted comes back with it."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Rule, Unit
from ratelimit_sidecar.core import Code, FleetLimiter, Limiter, LocalLimiter
from ratelimit_sidecar.core.evicted import EvictedCounts
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a minute boundary


LIMIT = RateLimit(1000, Unit.MINUTE)
OTHER = RateLimit(5, Unit.MINUTE)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 50)), max_size=400))
def test_records_give_back_what_each_key_counted(records: list[tuple[int, int]]) -> None:
    evicted, truth = EvictedCounts(capacity=1000), dict[int, int]()
    for name, count in records:  # a key evicted again records its count so far again
        evicted.record(("d", "k", str(name)), LIMIT, count, T0)
        truth[name] = count
    for name, count in truth.items():
        assert evicted.estimate(("d", "k", str(name)), LIMIT, T0 // 60_000) == count
    assert evicted.estimate(("d", "k", "never"), LIMIT, T0 // 60_000) == 0


def test_records_are_per_limit_and_window() -> None:
    evicted, key = EvictedCounts(capacity=10), ("d", "k", "v")
    evicted.record(key, LIMIT, 30, T0)
    assert evicted.estimate(key, LIMIT, T0 // 60_000) == 30
    assert evicted.estimate(key, OTHER, T0 // 60_000) == 0  # another limit: its own count
    assert evicted.estimate(key, LIMIT, T0 // 60_000 + 1) == 0  # the window ended


def test_when_full_an_ended_window_then_the_smallest_count_makes_room() -> None:
    evicted = EvictedCounts(capacity=3)
    evicted.record(("d", "k", "old"), LIMIT, 50, T0 - 60_000)  # last window
    evicted.record(("d", "k", "heavy"), LIMIT, 40, T0)
    evicted.record(("d", "k", "light"), LIMIT, 1, T0)
    evicted.record(("d", "k", "a"), LIMIT, 5, T0)  # drops "old": its window ended
    evicted.record(("d", "k", "b"), LIMIT, 7, T0)  # drops "light", the smallest
    now = T0 // 60_000
    assert [evicted.estimate(("d", "k", n), LIMIT, now) for n in ("heavy", "light", "a", "b")] == [
        40,
        0,
        5,
        7,
    ]


def test_a_flood_of_heavy_values_blocks_no_other_key() -> None:
    """Evicted records are exact: a flood of keys that each count a lot under one rule makes no
    key of another rule, nor a new key of the same rule, look busy."""
    limiter, big, small = LocalLimiter(max_keys=200), rule(rpu=1000), rule(rpu=5, key="x")
    for i in range(5000):
        limiter.hit(T0 + i // 10, [hit(big, f"flood{i}", hits=900)])
        if i % 50 == 0:
            assert limiter.hit(T0 + i // 10, [hit(small, f"s{i}")]).code is Code.OK
            assert limiter.hit(T0 + i // 10, [hit(big, f"new{i}")]).code is Code.OK


def flood(limiter: Limiter, minutes: int, seed: int = 1) -> dict[str, list[int]]:
    """Five heavy clients at 2 requests/s against 60 per minute, and a flood of fresh values at
    40/s into a table of 200 keys: each heavy key's admissions per minute."""
    r, rng = rule(rpu=60, unit=Unit.MINUTE, spans=6), random.Random(seed)
    admitted = {f"heavy{i}": [0] * minutes for i in range(5)}
    for ms in range(0, minutes * 60_000, 25):
        now = T0 + ms
        limiter.hit(now, [hit(r, f"flood{rng.getrandbits(64)}")])
        if ms % 500 == 0:
            for name, per_minute in admitted.items():
                per_minute[ms // 60_000] += limiter.hit(now, [hit(r, name)]).code is Code.OK
        if isinstance(limiter, FleetLimiter) and ms % 10_000 == 0:
            batch = limiter.end_span(now)
            limiter.apply_sync(now, batch, None, resend=False)  # a store that never answers
    return admitted


def test_a_flood_of_fresh_values_does_not_reset_a_heavy_key_local_only() -> None:
    limiter = LocalLimiter(max_keys=200)
    admitted = flood(limiter, minutes=3)
    assert limiter.keys.evictions > 5_000
    for per_minute in admitted.values():
        assert all(count <= 60 * 1.05 for count in per_minute), per_minute
        assert all(count >= 55 for count in per_minute), per_minute  # not over-counted either


def test_a_heavy_key_evicted_and_back_in_its_window_resumes_its_count() -> None:
    r = rule(rpu=10, unit=Unit.MINUTE)
    for limiter in (LocalLimiter(max_keys=1), FleetLimiter(max_keys=1)):
        for i in range(8):
            limiter.hit(T0 + i, [hit(r, "heavy")])
        limiter.hit(T0 + 100_000 % 60_000, [hit(r, "other")])  # evicts "heavy"
        codes = [limiter.hit(T0 + 50_000 + i, [hit(r, "heavy")]).code for i in range(3)]
        assert codes == [Code.OK, Code.OK, Code.OVER_LIMIT], type(limiter).__name__


def test_a_sliding_key_evicted_at_a_window_end_resumes_in_the_next_window() -> None:
    """A trailing window reaches into the next fixed window: the record must too (a fixed
    window's record would be worth nothing there)."""
    limit = RateLimit(10, Unit.MINUTE, spans=6, algorithm=AlgorithmName.SLIDING_WINDOW)
    r = Rule("d", (("k", ""),), limit)
    start = T0 - T0 % 60_000 + 50_000  # the last span of a window
    for limiter in (LocalLimiter(max_keys=1), FleetLimiter(max_keys=1)):
        for i in range(8):
            limiter.hit(start + i, [hit(r, "heavy")])
        limiter.hit(start + 15_000, [hit(r, "other")])  # the next window: evicts "heavy"
        codes = [limiter.hit(start + 16_000 + i, [hit(r, "heavy")]).code for i in range(3)]
        assert codes == [Code.OK, Code.OK, Code.OVER_LIMIT], type(limiter).__name__

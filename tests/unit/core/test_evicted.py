"""Eviction cannot reset a counter: what an evicted key counted comes back with it."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit_sidecar.config.model import Unit
from ratelimit_sidecar.core import Code, FleetLimiter, Limiter, LocalLimiter
from ratelimit_sidecar.core.evicted import EvictedCounts
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000  # a minute boundary


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(1, 50)), max_size=400))
def test_the_sketch_never_under_counts(records: list[tuple[int, int]]) -> None:
    sketch, truth = EvictedCounts(), dict[int, int]()
    for name, count in records:  # a key evicted again records its count so far again
        sketch.record(("d", "k", str(name)), 60_000, 7, count)
        truth[name] = max(truth.get(name, 0), count)
    for name, count in truth.items():
        assert sketch.estimate(("d", "k", str(name)), 60_000, 7) >= count


def test_the_sketch_forgets_a_window_that_ended() -> None:
    sketch, key = EvictedCounts(), ("d", "k", "v")
    sketch.record(key, 60_000, 7, 30)
    assert sketch.estimate(key, 60_000, 7) == 30
    assert sketch.estimate(key, 60_000, 8) == 0
    sketch.record(key, 60_000, 8, 2)
    assert sketch.estimate(key, 60_000, 8) == 2
    sketch.record(key, 60_000, 7, 5)  # a late eviction for an ended window: nothing to keep
    assert sketch.estimate(key, 60_000, 7) == 0


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

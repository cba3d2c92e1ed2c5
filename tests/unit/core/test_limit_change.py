"""A key whose limit changes (a reload, a runtime override) keeps its count when only the number
changed; another way of counting starts over."""

from __future__ import annotations

from dataclasses import replace

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Rule, Unit
from ratelimit_sidecar.core import Code, LocalLimiter
from ratelimit_sidecar.core.limiter import same_counting
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_000_000  # a second's start


def _codes(limiter: LocalLimiter, r: Rule, n: int, now: int = T0) -> list[Code]:
    return [limiter.hit(now, [hit(r)]).code for _ in range(n)]


def _with_limit(r: Rule, limit: RateLimit) -> Rule:
    return Rule(r.domain, r.path, limit)


def test_a_raised_limit_counts_on_from_the_windows_count_and_lifts_the_block() -> None:
    limiter, three = LocalLimiter(), rule(3)
    assert _codes(limiter, three, 4) == [Code.OK] * 3 + [Code.OVER_LIMIT]  # blocked now
    assert three.limit is not None

    five = _with_limit(three, replace(three.limit, requests_per_unit=5))
    assert _codes(limiter, five, 3) == [Code.OK, Code.OK, Code.OVER_LIMIT]


def test_a_lowered_limit_refuses_at_once_when_the_count_is_over_it() -> None:
    limiter, ten = LocalLimiter(), rule(10)
    assert _codes(limiter, ten, 4) == [Code.OK] * 4
    assert ten.limit is not None

    two = _with_limit(ten, replace(ten.limit, requests_per_unit=2))
    assert _codes(limiter, two, 1) == [Code.OVER_LIMIT]


def test_another_way_of_counting_starts_over() -> None:
    limiter, three = LocalLimiter(), rule(3)
    assert three.limit is not None
    _codes(limiter, three, 3)

    minute = _with_limit(three, replace(three.limit, unit=Unit.MINUTE))
    assert _codes(limiter, minute, 4) == [Code.OK] * 3 + [Code.OVER_LIMIT]


def test_only_summed_windows_with_the_same_schedule_keep_counts() -> None:
    base = RateLimit(10, Unit.MINUTE)
    bucket = replace(base, algorithm=AlgorithmName.TOKEN_BUCKET)
    sliding = replace(base, algorithm=AlgorithmName.SLIDING_WINDOW)
    log = replace(base, algorithm=AlgorithmName.SLIDING_LOG)

    assert same_counting(base, replace(base, requests_per_unit=99, name="x"))
    assert same_counting(sliding, replace(sliding, requests_per_unit=99))
    assert same_counting(bucket, replace(bucket))  # unchanged: always kept
    assert not same_counting(bucket, replace(bucket, requests_per_unit=99))
    assert not same_counting(log, replace(log, requests_per_unit=99))
    assert not same_counting(base, replace(base, spans=3))
    assert not same_counting(base, replace(base, unit_multiplier=2))
    assert not same_counting(base, sliding)

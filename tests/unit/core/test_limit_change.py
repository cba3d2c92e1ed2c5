"""A key whose limit changes (a reload, a runtime override) keeps its count when only the number
changed; another way of counting starts over."""

from __future__ import annotations

from dataclasses import replace

from ratelimit_sidecar.config.model import AlgorithmName, Penalty, RateLimit, Rule, Unit
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


def _hammered_first_waits(limiter: LocalLimiter, rules: list[tuple[int, Rule]]) -> list[int]:
    """A client sending every 50 ms for 20 s, under the rule of the latest (from, rule) whose
    time has come: the Retry-After (ms) of each block's first refusal."""
    waits, was_refused = [], False
    for now in range(T0, T0 + 20_000, 50):
        current = [r for start, r in rules if start <= now][-1]
        decision = limiter.hit(now, [hit(current)])
        refused = decision.code is Code.OVER_LIMIT
        if refused and not was_refused:
            waits.append(decision.verdicts[0].reset_ms)
        was_refused = refused
    return waits


def _penalised(penalty: Penalty | None) -> Rule:
    limit = RateLimit(2, Unit.SECOND, spans=2, cooldown_ms=1000, penalty=penalty)
    return Rule("d", (("k", ""),), limit)


GROWING = Penalty(factor=2.0, max_ms=60_000, forgive_after_ms=60_000)


def test_a_removed_penalty_no_longer_lengthens_the_keys_blocks() -> None:
    limiter = LocalLimiter()
    before = _hammered_first_waits(limiter, [(T0, _penalised(GROWING))])
    assert before[:4] == [1000, 2000, 4000, 8000]  # the level grew under the penalty

    limiter = LocalLimiter()  # the same client; the penalty gone once its third block ended
    after = _hammered_first_waits(
        limiter, [(T0, _penalised(GROWING)), (T0 + 7_300, _penalised(None))]
    )

    assert after[:3] == [1000, 2000, 4000]
    assert after[3:] and set(after[3:]) == {1000}  # plain cooldowns once the penalty is gone


def test_a_changed_penalty_starts_its_levels_afresh() -> None:
    capped = Penalty(factor=3.0, max_ms=60_000, forgive_after_ms=60_000)
    limiter = LocalLimiter()
    rules = [(T0, _penalised(GROWING)), (T0 + 7_300, _penalised(capped))]

    waits = _hammered_first_waits(limiter, rules)

    assert waits[:5] == [1000, 2000, 4000, 1000, 3000]  # level 0 again, then x3

"""Merging a strict request's answers back into descriptor order (pure: no store involved)."""

from __future__ import annotations

from dataclasses import replace

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, StoreFailure, Unit
from ratelimit_sidecar.core import Code, Verdict
from ratelimit_sidecar.service.strict import Part, answer_verdict, eventual_twin, merge
from ratelimit_sidecar.storage.strict_store import StrictAnswer, StrictCheck

LIMIT = RateLimit(10, Unit.MINUTE, strict=True)
OK5 = Verdict(Code.OK, LIMIT, remaining=5, reset_ms=100)
OK2 = Verdict(Code.OK, LIMIT, remaining=2, reset_ms=900)
OVER_SHORT = Verdict(Code.OVER_LIMIT, LIMIT, reset_ms=100)
OVER_LONG = Verdict(Code.OVER_LIMIT, LIMIT, reset_ms=5000)
SHADOWED = Verdict(Code.OK, LIMIT, reset_ms=9000, shadow_refused=True, shadow=True)
UNMATCHED = Verdict(Code.OK)


def test_parts_go_back_to_their_descriptors_in_order() -> None:
    parts = [Part(0, False, 0), Part(1, True, 0), Part(2, True, 1), Part(2, False, 1)]
    decision = merge(3, parts, [OK5, OK2], [UNMATCHED, OK5])
    assert decision.code is Code.OK
    assert decision.verdicts == (UNMATCHED, OK5, OK2)  # descriptor 2: the fewest remaining


def test_a_refusal_wins_and_the_longest_wait_among_refusals() -> None:
    parts = [Part(0, True, 0), Part(0, True, 1), Part(0, False, 0)]
    decision = merge(1, parts, [OVER_SHORT, OK5], [OVER_LONG])
    assert decision.code is Code.OVER_LIMIT and decision.verdicts == (OVER_LONG,)


def test_an_enforced_refusal_beats_a_longer_shadowed_one() -> None:
    parts = [Part(0, True, 0), Part(0, False, 0)]
    assert merge(1, parts, [SHADOWED], [OVER_SHORT]).verdicts == (OVER_SHORT,)
    shadow_only = merge(1, parts, [SHADOWED], [OK5])
    assert shadow_only.code is Code.OK and shadow_only.verdicts == (SHADOWED,)


def test_one_refused_descriptor_makes_the_request_over_the_limit() -> None:
    parts = [Part(0, True, 0), Part(1, False, 0)]
    decision = merge(2, parts, [OK5], [OVER_LONG])
    assert decision.code is Code.OVER_LIMIT and decision.verdicts == (OK5, OVER_LONG)


def test_store_answers_become_the_verdicts_an_eventual_rule_gives() -> None:
    check = StrictCheck(("d", "k", "v"), LIMIT, 1, False)
    admitted = answer_verdict(check, StrictAnswer(True, 1, 700, True, 0))
    assert admitted == Verdict(Code.OK, LIMIT, remaining=1, reset_ms=700, near_limit=True)
    refused = answer_verdict(check, StrictAnswer(False, 0, 300, False, 0))
    assert refused == Verdict(Code.OVER_LIMIT, LIMIT, reset_ms=300)
    shadow = answer_verdict(check._replace(shadow=True), StrictAnswer(False, 0, 300, True, 0))
    assert shadow.code is Code.OK and shadow.shadow_refused and shadow.shadow


def test_the_eventual_twin_counts_the_same_window_in_memory() -> None:
    twin = eventual_twin(LIMIT)
    assert not twin.strict and twin.window_ms == LIMIT.window_ms
    log = replace(LIMIT, algorithm=AlgorithmName.SLIDING_LOG, on_store_failure=StoreFailure.LOCAL)
    assert eventual_twin(log).algorithm is AlgorithmName.SLIDING_WINDOW

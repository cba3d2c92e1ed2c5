"""The store's rules per algorithm (storage/shared_rules.py), with a fixed clock."""

from __future__ import annotations

import pytest

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Unit
from ratelimit_sidecar.core.types import Push
from ratelimit_sidecar.storage import shared_rules as rules

SLIDING = RateLimit(10, Unit.MINUTE, spans=7, algorithm=AlgorithmName.SLIDING_WINDOW)
BUCKET = RateLimit(10, Unit.MINUTE, algorithm=AlgorithmName.TOKEN_BUCKET)
ODD = RateLimit(7, Unit.MINUTE, burst=3, algorithm=AlgorithmName.TOKEN_BUCKET)
NOW = 1_700_000_000_000


def test_a_push_without_a_span_counts_in_its_windows_last_span() -> None:
    assert rules.pushed_span(Push(("d",), 100, 1, SLIDING)) == 706
    assert rules.pushed_span(Push(("d",), 100, 1, SLIDING, 701)) == 701


def test_the_answer_is_the_window_of_spans_ending_with_the_pushed_one() -> None:
    assert list(rules.answered_spans(706, SLIDING)) == list(range(700, 707))


def test_span_counters_live_a_window_and_two_of_the_longest_spans() -> None:
    assert rules.span_ttl_ms(SLIDING) == 60_000 + 2 * 8_572  # 60000/7 rounded up


@pytest.mark.parametrize(
    ("tat", "count", "expected"),
    [
        (0.0, 0, NOW),  # an unknown bucket is full: its TAT is now
        (0.0, 2, NOW + 12_000),
        (NOW - 50_000.0, 1, NOW + 6_000),  # a TAT in the past starts from now
        (NOW + 6_000.0, 3, NOW + 24_000),
        (NOW + 6_000.0, -1, NOW),
        (NOW + 6_000.0, -5, NOW),  # giving back never goes before now
    ],
)
def test_the_tat_moves_by_the_push_from_now_at_the_earliest(
    tat: float, count: int, expected: int
) -> None:
    assert rules.next_tat(tat, NOW, count, BUCKET) == expected


def test_a_fractional_token_time_is_kept_to_the_microsecond() -> None:
    tat = rules.next_tat(0.0, NOW, 1, ODD)
    assert abs(tat - (NOW + 60_000 / 7)) < 0.001
    assert f"{tat:.3f}" == repr(tat)  # stored as written: no more places to lose
    assert rules.bucket_debt_ms(tat, NOW) == 8_572
    assert rules.bucket_debt_ms(tat, NOW + 8_572) == 0
    assert rules.bucket_ttl_ms(NOW, NOW) == 1  # full: forgotten at once


def test_blocks_only_with_a_cooldown_and_past_the_limit() -> None:
    fixed = RateLimit(10, Unit.MINUTE)
    cool_bucket = RateLimit(7, Unit.MINUTE, burst=3, cooldown_ms=1, algorithm=ODD.algorithm)
    assert (rules.blocks(fixed, 10), rules.blocks(fixed, 11)) == (False, True)
    assert not rules.blocks(SLIDING, 11)  # no cooldown: no flag
    assert rules.bucket_full_debt_ms(ODD) == 3 * 60_000 / 7
    assert not rules.blocks(cool_bucket, 25_714) and rules.blocks(cool_bucket, 25_715)

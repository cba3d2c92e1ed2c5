"""bench/rlqs_table.py: capacity per core, pooled rows, per-round ratios, the verdict, the table."""

from __future__ import annotations

import pytest

from bench.rlqs_table import (
    ALLOW_ALL,
    PLAIN,
    RLQS,
    RLS,
    Sample,
    per_core,
    pooled,
    ratio,
    ratios,
    render,
    rps,
    verdict,
)


def sample(stack: str, round_no: int, requests: int, envoy: float, service: float = 0.0) -> Sample:
    """A 2-second sample; CPU as fractions of one core."""
    return Sample(stack, round_no, requests, 2.0, envoy, service)


def test_per_core_is_rps_over_the_stacks_own_cpu() -> None:
    x = sample(RLS, 0, 2000, envoy=0.1, service=0.4)  # 1,000 req/s on half a core
    assert x.rps == 1000
    assert x.per_core == pytest.approx(2000)
    assert sample(PLAIN, 0, 10, 0.0).per_core is None


def test_pooled_rows_weigh_rounds_by_time_and_give_cpu_per_request() -> None:
    rows = pooled([sample(RLS, 0, 2000, 0.1, 0.4), sample(RLS, 1, 4000, 0.2, 0.3)])
    (row,) = rows
    assert (row.rounds, row.requests, row.rps) == (2, 6000, 1500)
    assert row.per_core == pytest.approx(6000 / 2.0)  # 6,000 requests in 2 CPU seconds
    assert row.envoy_us == pytest.approx(0.6 / 6000 * 1e6)
    assert row.service_ms_per_1000 == pytest.approx(1.4 / 6000 * 1e6)


def test_rows_come_in_the_stacks_order_whatever_the_samples_order() -> None:
    found = [r.stack for r in pooled([sample(RLS, 0, 1, 1), sample(PLAIN, 0, 1, 1)])]
    assert found == [PLAIN, RLS]


def test_ratios_pair_stacks_of_the_same_round_only() -> None:
    samples = [
        sample(RLQS, 0, 900, 0.25),
        sample(ALLOW_ALL, 0, 1000, 0.25),
        sample(RLQS, 1, 500, 0.25),  # round 1 has no ALLOW_ALL sample: not paired
        sample(RLQS, 2, 1000, 0.25),
        sample(ALLOW_ALL, 2, 1000, 0.20),
    ]
    assert ratios(samples, RLQS, ALLOW_ALL, rps) == pytest.approx([0.9, 1.0])
    assert ratios(samples, RLQS, ALLOW_ALL, per_core) == pytest.approx([0.9, 0.8])
    found = ratio(samples, RLQS, ALLOW_ALL, per_core)
    assert (found.median, found.low, found.high) == pytest.approx((0.85, 0.8, 0.9))
    assert ratio(samples, RLS, PLAIN, rps).median is None


def test_samples_with_failed_requests_count_in_no_row_and_no_ratio() -> None:
    failed = Sample(PLAIN, 1, 0, 2.0, 0.5, 0.0, errors=1)
    samples = [
        sample(PLAIN, 0, 1000, 0.25),
        failed,
        sample(RLS, 0, 500, 0.25),
        sample(RLS, 1, 9, 1),
    ]
    (plain, _) = pooled(samples)
    assert plain.rounds == 1
    assert plain.per_core == pytest.approx(2000)
    assert ratios(samples, RLS, PLAIN, rps) == pytest.approx([0.5])


def test_the_verdict_is_the_median_per_core_against_95_percent() -> None:
    def rounds(*values: int) -> list[Sample]:
        pairs = [
            (sample(RLQS, i, v, 0.25), sample(ALLOW_ALL, i, 1000, 0.25))
            for i, v in enumerate(values)
        ]
        return [x for pair in pairs for x in pair]

    assert verdict(rounds(960, 940, 990))[0] is True
    passed, text = verdict(rounds(900, 990, 940))
    assert passed is False
    assert "FAIL" in text
    assert "94.0%" in text
    assert verdict([sample(PLAIN, 0, 10, 1)])[0] is None


def test_the_table_shows_each_stack_and_each_comparison() -> None:
    samples = [sample(s, 0, 1000, 0.25, 0.01) for s in (PLAIN, ALLOW_ALL, RLQS, RLS)]
    text = "\n".join(render(samples))
    for stack in (PLAIN, ALLOW_ALL, RLQS, RLS):
        assert stack in text
    assert "rlqs-sidecar / rlqs-allow-all" in text
    assert "100.0% (100.0%–100.0%)" in text

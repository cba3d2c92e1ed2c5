"""The strict checks' circuit breaker on a fake clock."""

from __future__ import annotations

from ratelimit_sidecar.core.breaker import Breaker, BreakerState


def opened(now_ms: int = 0) -> Breaker:
    breaker = Breaker(failures_to_open=3, open_ms=1000)
    for _ in range(3):
        assert breaker.allow(now_ms)
        breaker.failed(now_ms)
    return breaker


def state(breaker: Breaker) -> BreakerState:
    return breaker.state  # read afresh: keeps the type checker from narrowing across calls


def test_closed_lets_every_call_through() -> None:
    breaker = Breaker()
    assert all(breaker.allow(t) for t in range(0, 10_000, 100))
    assert state(breaker) is BreakerState.CLOSED and breaker.retry_in_ms(5) == 0


def test_failures_in_a_row_open_it() -> None:
    breaker = Breaker(failures_to_open=3, open_ms=1000)
    breaker.failed(0)
    breaker.failed(1)
    assert state(breaker) is BreakerState.CLOSED
    breaker.failed(2)
    assert state(breaker) is BreakerState.OPEN
    assert not breaker.allow(3) and breaker.retry_in_ms(3) == 999


def test_a_success_resets_the_count() -> None:
    breaker = Breaker(failures_to_open=3)
    for t in range(10):
        breaker.failed(t)
        breaker.failed(t)
        breaker.succeeded()
    assert state(breaker) is BreakerState.CLOSED


def test_open_refuses_calls_until_open_ms_then_lets_one_probe() -> None:
    breaker = opened(now_ms=100)
    assert not breaker.allow(1099)
    assert breaker.allow(1100)  # the probe
    assert state(breaker) is BreakerState.HALF_OPEN
    assert not breaker.allow(1101) and not breaker.allow(2099)  # one probe at a time


def test_a_successful_probe_closes_it() -> None:
    breaker = opened()
    assert breaker.allow(1000)
    breaker.succeeded()
    assert state(breaker) is BreakerState.CLOSED and breaker.allow(1001)


def test_a_failed_probe_opens_it_for_another_period() -> None:
    breaker = opened()
    assert breaker.allow(1000)
    breaker.failed(1040)
    assert state(breaker) is BreakerState.OPEN
    assert not breaker.allow(2039) and breaker.allow(2040)


def test_a_probe_that_never_reports_is_replaced_after_open_ms() -> None:
    breaker = opened()
    assert breaker.allow(1000)  # this probe's request is cancelled: no success, no failure
    assert not breaker.allow(1999)
    assert breaker.allow(2000)
    breaker.succeeded()
    assert state(breaker) is BreakerState.CLOSED

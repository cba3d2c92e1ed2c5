"""StrictDecider on real Redis: strict and eventual limits of one request, shadow mode, and
what each `on_store_failure` does when Redis is gone (with the circuit breaker)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Rule, StoreFailure, Unit
from ratelimit_sidecar.core import Code, FleetLimiter, Hit
from ratelimit_sidecar.core.breaker import Breaker, BreakerState
from ratelimit_sidecar.core.limiter import limit_key
from ratelimit_sidecar.service.strict import StrictDecider
from ratelimit_sidecar.storage.keys import counter_suffix
from ratelimit_sidecar.storage.redis_urls import open_redis
from ratelimit_sidecar.storage.strict_store import StrictStore

pytestmark = pytest.mark.integration

STRICT = RateLimit(requests_per_unit=3, unit=Unit.HOUR, strict=True)
EVENTUAL = RateLimit(requests_per_unit=2, unit=Unit.HOUR)


class Recorder:
    def __init__(self) -> None:
        self.results: list[str] = []

    def strict_checked(self, result: str, seconds: float) -> None:
        self.results.append(result)


def rule(*limits: RateLimit, shadow: bool = False, name: str = "user") -> Rule:
    return Rule("d", ((name, ""),), limits=limits, shadow_mode=shadow)


def hit(r: Rule, hits: int = 1) -> Hit:
    return Hit(r, ("d", r.path[0][0], uuid.uuid4().hex[:8]), hits)


def now() -> int:
    return int(time.time() * 1000)


async def decider_on(url: str, **kw: Any) -> StrictDecider:
    storage = open_redis(url, prefix=f"t{uuid.uuid4().hex[:8]}:")
    store = StrictStore(storage)
    assert await store.prepare()  # as Sidecar.startup does
    return StrictDecider(FleetLimiter(), store, timeout_ms=50, **kw)


@pytest.fixture(params=["standalone", "cluster"])
async def decider(request: pytest.FixtureRequest) -> AsyncIterator[StrictDecider]:
    name = "redis_server" if request.param == "standalone" else "redis_cluster"
    made = await decider_on(request.getfixturevalue(name).url)
    try:
        yield made
    finally:
        await made.store.client.aclose()  # type: ignore[attr-defined]


async def redis_count(decider: StrictDecider, key: tuple[str, ...], limit: RateLimit) -> int:
    store: Any = decider.store
    window = now() // limit.window_ms
    value = await store.client.get(f"{store.keys.tag(key)}{counter_suffix(key, window)}")
    return int(value or 0)


async def test_a_strict_refusal_keeps_eventual_counters_still(decider: StrictDecider) -> None:
    strict, eventual = hit(rule(STRICT), 1), hit(rule(EVENTUAL, name="ip"), 1)
    for _ in range(3):
        decision = await decider.decide(now(), [strict, eventual._replace(hits=0)])
        assert decision.code is Code.OK
    decision = await decider.decide(now(), [strict, eventual])
    assert decision.code is Code.OVER_LIMIT
    assert [v.code for v in decision.verdicts] == [Code.OVER_LIMIT, Code.OK]
    state = decider.limiter.keys.get(eventual.key)
    assert state is not None and state.pending == 0  # checked, not counted
    assert await redis_count(decider, strict.key, STRICT) == 3


async def test_strict_counts_even_when_an_eventual_descriptor_refuses(
    decider: StrictDecider,
) -> None:
    """Documented: Redis counted the strict hit before memory refused the request."""
    strict, eventual = hit(rule(STRICT)), hit(rule(EVENTUAL, name="ip"), 3)
    decision = await decider.decide(now(), [strict, eventual])
    assert [v.code for v in decision.verdicts] == [Code.OK, Code.OVER_LIMIT]
    assert decision.verdicts[0].remaining == 2
    assert await redis_count(decider, strict.key, STRICT) == 1


async def test_one_descriptor_with_a_strict_and_an_eventual_limit(decider: StrictDecider) -> None:
    both = hit(rule(STRICT, replace(EVENTUAL, requests_per_unit=5)))
    answers = [await decider.decide(now(), [both]) for _ in range(4)]
    assert [d.code for d in answers] == [Code.OK] * 3 + [Code.OVER_LIMIT]
    assert [d.verdicts[0].remaining for d in answers[:3]] == [2, 1, 0]  # the fewest remaining
    assert answers[3].verdicts[0].limit is STRICT
    state = decider.limiter.keys.get(limit_key(both.key, 1))
    assert state is not None and state.pending == 3  # the refused fourth was not counted
    assert await redis_count(decider, limit_key(both.key, 0), STRICT) == 3


async def test_shadow_mode_answers_ok_and_counts(decider: StrictDecider) -> None:
    shadowed = hit(rule(STRICT, shadow=True), 5)
    decision = await decider.decide(now(), [shadowed])
    (verdict,) = decision.verdicts
    assert decision.code is Code.OK and verdict.shadow_refused and verdict.shadow
    assert await redis_count(decider, shadowed.key, STRICT) == 5


async def test_check_only_hits_answer_without_counting(decider: StrictDecider) -> None:
    probe = hit(rule(STRICT), 0)
    decision = await decider.decide(now(), [probe])
    assert decision.code is Code.OK and decision.verdicts[0].remaining == 3
    assert await redis_count(decider, probe.key, STRICT) == 0


async def test_sliding_log_through_the_decider(decider: StrictDecider) -> None:
    log = replace(STRICT, algorithm=AlgorithmName.SLIDING_LOG)
    h = hit(rule(log))
    codes = [(await decider.decide(now(), [h])).code for _ in range(4)]
    assert codes == [Code.OK] * 3 + [Code.OVER_LIMIT]


@pytest.mark.parametrize("policy", list(StoreFailure))
async def test_store_failure_policies_with_redis_gone(
    own_redis_server: Any, policy: StoreFailure
) -> None:
    recorder = Recorder()
    decider = await decider_on(own_redis_server.url, observer=recorder, breaker=Breaker(3, 500))
    limit = replace(STRICT, on_store_failure=policy)
    h = hit(rule(limit))
    assert (await decider.decide(now(), [h])).code is Code.OK  # Redis counts the first
    own_redis_server.kill()
    codes = [(await decider.decide(now(), [h])).code for _ in range(5)]
    expected = {
        StoreFailure.LOCAL: [Code.OK] * 3 + [Code.OVER_LIMIT] * 2,  # the twin: its own 3
        StoreFailure.ALLOW: [Code.OK] * 5,
        StoreFailure.DENY: [Code.OVER_LIMIT] * 5,
    }[policy]
    assert codes == expected
    assert recorder.results == [
        "admitted",
        "failed",
        "failed",
        "failed",
        "breaker_open",
        "breaker_open",
    ]
    assert decider.breaker.state is BreakerState.OPEN
    if policy is StoreFailure.LOCAL:
        twin = decider.limiter.keys.get(h.key)
        assert twin is not None and not twin.limit.strict and twin.pending == 3
    await decider.store.client.aclose()  # type: ignore[attr-defined]


async def test_the_breaker_probes_and_closes_when_redis_is_back(own_redis_server: Any) -> None:
    recorder = Recorder()
    decider = await decider_on(own_redis_server.url, observer=recorder, breaker=Breaker(2, 200))
    h = hit(rule(replace(STRICT, on_store_failure=StoreFailure.DENY)))
    own_redis_server.kill()
    for _ in range(3):
        await decider.decide(now(), [h])
    assert recorder.results == ["failed", "failed", "breaker_open"]
    own_redis_server.restart()
    time.sleep(0.25)
    assert (await decider.decide(now(), [h])).code is Code.OK  # the probe, answered by Redis
    assert decider.breaker.state is BreakerState.CLOSED
    await decider.store.client.aclose()  # type: ignore[attr-defined]


async def test_a_frozen_redis_costs_the_timeout_until_the_breaker_opens(
    own_redis_server: Any,
) -> None:
    decider = await decider_on(own_redis_server.url, breaker=Breaker(3, 10_000))
    h = hit(rule(replace(STRICT, on_store_failure=StoreFailure.ALLOW)))
    await decider.decide(now(), [h])
    own_redis_server.pause()
    try:
        took = []
        for _ in range(50):
            started = time.perf_counter()
            assert (await decider.decide(now(), [h])).code is Code.OK
            took.append(time.perf_counter() - started)
    finally:
        own_redis_server.resume()
    assert all(0.045 <= t < 0.2 for t in took[:3])  # the strict timeout, 50 ms
    open_answers = sorted(took[3:])
    assert open_answers[int(0.99 * (len(open_answers) - 1))] < 0.005
    await decider.store.client.aclose()  # type: ignore[attr-defined]

"""strict.lua on real Redis (standalone and Cluster): each algorithm's answers, all-or-nothing
across limits, Redis TIME as the clock, NOSCRIPT recovery.

Every algorithm is checked against its pure core module (in a `LocalLimiter`, fed the Redis
times of the answers): the core module is the rule, the script must take its decisions.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, cast

import pytest
from redis.crc import key_slot

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Rule, Unit
from ratelimit_sidecar.core import Code, Hit, LocalLimiter
from ratelimit_sidecar.storage.keys import counter_suffix, digest
from ratelimit_sidecar.storage.redis_urls import open_redis
from ratelimit_sidecar.storage.strict_store import StrictAnswer, StrictCheck, StrictStore

pytestmark = pytest.mark.integration

MINUTE = RateLimit(requests_per_unit=10, unit=Unit.MINUTE)
HOUR = RateLimit(requests_per_unit=10, unit=Unit.HOUR)


@pytest.fixture(params=["standalone", "cluster"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StrictStore]:
    where = request.getfixturevalue(
        "redis_server" if request.param == "standalone" else "redis_cluster"
    )
    storage = open_redis(where.url, prefix=f"t{uuid.uuid4().hex[:8]}:")
    try:
        yield StrictStore(storage)
    finally:
        await storage.close()


def key(name: str) -> tuple[str, ...]:
    return ("strict", "user", f"{name}-{uuid.uuid4().hex[:6]}")


def same_slot_keys() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Two keys whose digests share a Cluster hash slot (found by trying names)."""
    first = key("a")
    slot = key_slot(digest(first).encode())
    for n in range(200_000):
        other = (*first[:2], f"b{n}")
        if key_slot(digest(other).encode()) == slot:
            return first, other
    raise AssertionError("no key found in the slot")


async def one(store: StrictStore, check: StrictCheck) -> StrictAnswer:
    (answer,) = await store.check([check])
    return answer


async def test_fixed_window_agrees_with_the_core_in_one_window(store: StrictStore) -> None:
    """Same admissions and remaining as the local-only core, replayed at Redis's own times."""
    limit = HOUR
    for _attempt in range(3):  # a run that straddles an hour boundary is run again
        k = key("fw")
        answers = [await one(store, StrictCheck(k, limit, 1, False)) for _ in range(13)]
        if answers[0].now_ms // limit.window_ms == answers[-1].now_ms // limit.window_ms:
            break
    local = LocalLimiter()
    rule = Rule("strict", (("user", ""),), limit=limit)
    for answer in answers:
        decision = local.hit(answer.now_ms, [Hit(rule, k, 1)])
        assert answer.fits == (decision.code is Code.OK)
        if answer.fits:
            assert answer.remaining == decision.verdicts[0].remaining
            assert answer.reset_ms == decision.verdicts[0].reset_ms
        assert answer.counted == answer.fits
    assert sum(a.fits for a in answers) == 10


async def test_fixed_window_counts_in_the_eventual_sync_counter(store: StrictStore) -> None:
    k = key("same-key")
    answer = await one(store, StrictCheck(k, HOUR, 3, False))
    window = answer.now_ms // HOUR.window_ms
    name = f"{store.keys.tag(k)}{counter_suffix(k, window)}"
    assert int(cast(bytes, await store.client.get(name))) == 3
    assert 0 < await store.client.pttl(name) <= 2 * HOUR.window_ms


async def test_redis_time_dates_the_check(store: StrictStore) -> None:
    before = int(time.time() * 1000)
    answer = await one(store, StrictCheck(key("time"), MINUTE, 1, False))
    after = int(time.time() * 1000)
    assert before - 50 <= answer.now_ms <= after + 50  # loopback Redis shares our clock
    assert answer.reset_ms == MINUTE.window_ms - answer.now_ms % MINUTE.window_ms


async def test_check_only_and_negative_hits(store: StrictStore) -> None:
    k = key("neg")
    assert (await one(store, StrictCheck(k, HOUR, 10, False))).remaining == 0
    check_only = await one(store, StrictCheck(k, HOUR, 0, False))
    assert check_only.fits and check_only.remaining == 0
    assert (await one(store, StrictCheck(k, HOUR, -4, False))).remaining == 4
    assert (await one(store, StrictCheck(k, HOUR, -40, False))).remaining == 10  # never below 0


async def test_a_refusal_starts_the_cooldown_as_the_core_does(store: StrictStore) -> None:
    k = key("cool")
    assert (await one(store, StrictCheck(k, HOUR, 10, False))).remaining == 0
    refused = await one(store, StrictCheck(k, HOUR, 1, False))
    assert not refused.fits and refused.reset_ms == HOUR.cooldown
    blocked = await one(store, StrictCheck(k, HOUR, 0, False))  # even a check, as in the core
    assert not blocked.fits and 0 < blocked.reset_ms <= HOUR.cooldown
    assert 0 < await store.client.pttl(store.keys.flag(k)) <= HOUR.cooldown


async def test_all_or_nothing_across_limits(store: StrictStore) -> None:
    """One limit refusing stops every limit of the call from counting; a shadow one does not."""
    a, b = same_slot_keys()
    small = replace(HOUR, requests_per_unit=2)
    await one(store, StrictCheck(b, small, 2, False))  # b is full
    refused = await store.check([StrictCheck(a, HOUR, 1, False), StrictCheck(b, small, 1, False)])
    assert [x.fits for x in refused] == [True, False]
    assert not refused[0].counted and refused[0].remaining == 10
    shadowed = await store.check([StrictCheck(a, HOUR, 1, False), StrictCheck(b, small, 1, True)])
    assert [x.fits for x in shadowed] == [True, False]
    assert shadowed[0].counted and shadowed[0].remaining == 9


async def test_limits_of_one_descriptor_share_a_call_per_slot(store: StrictStore) -> None:
    checks = [StrictCheck(key(f"k{i}"), HOUR, 1, False) for i in range(20)]
    groups = store._groups(checks)
    assert len(groups) == 1 if not store.cluster else len(groups) > 1
    assert sorted(i for g in groups for i in g) == list(range(20))
    answers = await store.check(checks)
    assert [a.remaining for a in answers] == [9] * 20


async def test_sliding_window_weights_the_span_before_the_trailing_window(
    store: StrictStore,
) -> None:
    """Seeded span counters: N recent spans in full, the one before by its share still inside."""
    limit = RateLimit(
        requests_per_unit=100, unit=Unit.HOUR, algorithm=AlgorithmName.SLIDING_WINDOW, spans=6
    )
    k = key("sw")
    probe = await one(store, StrictCheck(k, limit, 0, False))
    span_ms = limit.window_ms // limit.spans
    cur = probe.now_ms // span_ms
    base = f"{store.keys.tag(k)}{counter_suffix(k, '')}"
    await store.client.set(f"{base}s{cur - limit.spans}", 60)  # the span leaving the window
    await store.client.set(f"{base}s{cur - 1}", 30)
    answer = await one(store, StrictCheck(k, limit, 1, False))
    ends = (cur + 1) * span_ms - answer.now_ms
    expected = 100 - 30 - 1 - 60 * (ends - 1) / span_ms  # its ms after now - W still count
    assert answer.fits == (expected >= 0)
    assert answer.remaining == max(0, int(expected // 1))
    big = await one(store, StrictCheck(k, limit, 70, False))
    assert not big.fits  # 31 + 70 > 100 whatever the old span's weight
    # Retry-After: 70 fit once the 30 of span cur - 1 are mostly out of the window, in span
    # cur + 5 (the current span's 1 still counts): 30 x (ms still inside) <= 29 x span_ms.
    fits_at = (cur + 6) * span_ms - 1 - (29 * span_ms) // 30
    assert big.reset_ms == fits_at - big.now_ms


async def test_token_bucket_spends_and_refills_by_redis_time(store: StrictStore) -> None:
    limit = RateLimit(
        requests_per_unit=10, unit=Unit.SECOND, algorithm=AlgorithmName.TOKEN_BUCKET, burst=5
    )
    k = key("tb")
    answers = [await one(store, StrictCheck(k, limit, 1, False)) for _ in range(7)]
    admitted = [a for a in answers if a.fits]
    assert 5 <= len(admitted) <= 6  # a token refills every 100 ms; at most one during the run
    refused = next(a for a in answers if not a.fits)
    assert 0 < refused.reset_ms <= 100
    tat = float(
        cast(bytes, await store.client.get(f"{store.keys.tag(k)}{counter_suffix(k, 'tb')}"))
    )
    assert tat - refused.now_ms == pytest.approx(limit.capacity * 100, abs=101)
    time.sleep(refused.reset_ms / 1000 + 0.01)
    assert (await one(store, StrictCheck(k, limit, 1, False))).fits


async def test_sliding_log_admits_max_in_any_trailing_window(store: StrictStore) -> None:
    limit = RateLimit(requests_per_unit=3, unit=Unit.SECOND, algorithm=AlgorithmName.SLIDING_LOG)
    k = key("log")
    first = [await one(store, StrictCheck(k, limit, 1, False)) for _ in range(4)]
    assert [a.fits for a in first] == [True, True, True, False]
    wait = first[3].reset_ms
    assert 0 < wait <= 1000 and wait >= 1000 - (first[3].now_ms - first[0].now_ms) - 1
    log = f"{store.keys.tag(k)}{counter_suffix(k, 'log')}"
    assert await store.client.zcard(log) == 3
    time.sleep(wait / 1000 + 0.01)
    again = await one(store, StrictCheck(k, limit, 1, False))
    assert again.fits and again.remaining == 2  # the first three were sent within ms: all gone
    assert (await one(store, StrictCheck(k, limit, -1, False))).remaining == 3


async def test_a_shared_block_flag_refuses_until_it_expires(store: StrictStore) -> None:
    k = key("flag")
    await store.client.set(store.keys.flag(k), "1", px=5000)
    answer = await one(store, StrictCheck(k, HOUR, 1, False))
    assert not answer.fits and answer.reset_ms >= 4000


async def test_the_script_is_loaded_again_after_a_flush(store: StrictStore) -> None:
    k = key("flush")
    await one(store, StrictCheck(k, HOUR, 1, False))
    client: Any = store.client
    await client.script_flush()
    assert (await one(store, StrictCheck(k, HOUR, 1, False))).remaining == 8


def other_slot_keys() -> tuple[tuple[str, ...], tuple[str, ...]]:
    first = key("x")
    slot = key_slot(digest(first).encode())
    for n in range(100):
        other = (*first[:2], f"y{n}")
        if key_slot(digest(other).encode()) != slot:
            return first, other
    raise AssertionError("no key found in another slot")


async def test_a_refusal_in_one_slot_takes_back_the_hits_of_the_others(
    store: StrictStore,
) -> None:
    """On Cluster two calls, the second giving back what the first counted; one on standalone."""
    a, b = other_slot_keys()
    small = replace(HOUR, requests_per_unit=2)
    await one(store, StrictCheck(b, small, 2, False))
    checks = [StrictCheck(a, HOUR, 3, False), StrictCheck(b, small, 1, False)]
    assert len(store._groups(checks)) == (2 if store.cluster else 1)
    answers = await store.check(checks)
    assert [x.fits for x in answers] == [True, False]
    assert not answers[0].counted and answers[0].remaining == 10
    assert (await one(store, StrictCheck(a, HOUR, 0, False))).remaining == 10


async def test_a_shadow_log_takes_a_huge_hits_addend_in_bounded_time(store: StrictStore) -> None:
    limit = RateLimit(requests_per_unit=5, unit=Unit.SECOND, algorithm=AlgorithmName.SLIDING_LOG)
    k = key("huge")
    started = time.perf_counter()
    answer = await one(store, StrictCheck(k, limit, 2**32 - 1, True))
    assert time.perf_counter() - started < 1.0
    assert not answer.fits and answer.counted
    assert await store.client.zcard(f"{store.keys.tag(k)}{counter_suffix(k, 'log')}") == 6


async def test_a_long_windows_refusal_walks_its_spans_once(store: StrictStore) -> None:
    """An hour of 3,600 spans, the newest holding the whole limit: a refusal's wait walks every
    span. Its time stays close to an admitted check's (the same GETs), not spans² / 2 sums."""
    limit = RateLimit(3600, Unit.HOUR, algorithm=AlgorithmName.SLIDING_WINDOW, spans=3600)
    k = key("long")
    probe = await one(store, StrictCheck(k, limit, 0, False))
    cur = probe.now_ms // (limit.window_ms // limit.spans)
    await store.client.set(f"{store.keys.tag(k)}{counter_suffix(k, '')}s{cur}", 3600)
    checks, refusals = [], []
    for _ in range(3):  # the fastest of three: the machine is shared
        started = time.perf_counter()
        await one(store, StrictCheck(k, limit, 0, False))
        checks.append(time.perf_counter() - started)
        started = time.perf_counter()
        refused = await one(store, StrictCheck(k, limit, 1, False))
        refusals.append(time.perf_counter() - started)
        assert not refused.fits and refused.reset_ms > limit.window_ms - 2_000
    assert min(refusals) < 5 * min(checks) + 0.01, (checks, refusals)


AGREEING_LIMITS = {
    "fixed_window": RateLimit(5, Unit.SECOND, spans=4),
    "sliding_window": RateLimit(5, Unit.SECOND, spans=4, algorithm=AlgorithmName.SLIDING_WINDOW),
    "token_bucket": RateLimit(5, Unit.SECOND, algorithm=AlgorithmName.TOKEN_BUCKET, burst=3),
    "sliding_log": RateLimit(5, Unit.SECOND, algorithm=AlgorithmName.SLIDING_LOG),
}


@pytest.mark.parametrize("name", list(AGREEING_LIMITS))
async def test_every_algorithm_agrees_with_its_core_module(store: StrictStore, name: str) -> None:
    """A random sequence of checks, replayed in the local-only core at Redis's own times: the
    core module is the rule, the script must take every decision it takes."""
    limit, k = AGREEING_LIMITS[name], key(name)
    rng = random.Random(name)
    answers: list[StrictAnswer] = []
    sent: list[int] = []
    deadline = time.monotonic() + 1.6  # more than a window: spans and windows roll over
    while time.monotonic() < deadline and len(answers) < 200:
        hits = rng.choice((0, 1, 1, 1, 2, 3))
        answers.append(await one(store, StrictCheck(k, limit, hits, False)))
        sent.append(hits)
        time.sleep(rng.choice((0.0, 0.005, 0.02, 0.06)))
    local = LocalLimiter()
    rule = Rule("strict", (("user", ""),), limit=limit)
    refused = 0
    for index, (answer, hits) in enumerate(zip(answers, sent, strict=True)):
        verdict = local.hit(answer.now_ms, [Hit(rule, k, hits)]).verdicts[0]
        seen = (index, sent[: index + 1], answers[: index + 1], verdict)
        assert answer.fits == (verdict.code is Code.OK), seen
        assert answer.remaining == verdict.remaining, (index, answer, verdict)
        # Retry-After, the same wait (without a cooldown: the script's block flag starts at
        # its own refusals, the local core's at its span ends)
        if not answer.fits and hits > 0 and limit.cooldown == 0:
            assert answer.reset_ms == verdict.reset_ms, (index, answer, verdict)
        refused += not answer.fits
    assert refused > 0 and len(answers) > 20  # the sequence did reach the limit

"""The storage contract of the sliding window and token bucket syncs, run against every backend:
MemoryStorage (the reference), standalone Redis and Redis Cluster. Expected answers follow the
store's rules in ratelimit_sidecar/storage/shared_rules.py (the contract of common.md); the
numbers are spelled out so a wrong rule there fails here too.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Unit
from ratelimit_sidecar.core.types import KeyId, Push, PushResult, SyncResult
from ratelimit_sidecar.storage import shared_rules as rules
from ratelimit_sidecar.storage.keys import bucket_suffix, counter_suffix, span_suffix
from ratelimit_sidecar.storage.redis_store import RedisStorage
from ratelimit_sidecar.storage.redis_urls import open_redis
from tests.integration.test_storage_contract import (
    PATIENT,
    Backend,
    now_ms,
    open_backend,
    server_stats,
    sync,
)

pytestmark = pytest.mark.integration

SLIDING = RateLimit(10, Unit.MINUTE, spans=6, algorithm=AlgorithmName.SLIDING_WINDOW)
SLIDING_COOL = RateLimit(
    10, Unit.MINUTE, spans=6, cooldown_ms=5000, algorithm=AlgorithmName.SLIDING_WINDOW
)
BUCKET = RateLimit(10, Unit.MINUTE, algorithm=AlgorithmName.TOKEN_BUCKET)  # a token per 6 s
BUCKET_COOL = RateLimit(10, Unit.MINUTE, cooldown_ms=5000, algorithm=AlgorithmName.TOKEN_BUCKET)
BUCKET_ODD = RateLimit(7, Unit.MINUTE, burst=20, algorithm=AlgorithmName.TOKEN_BUCKET)
FIXED = RateLimit(10, Unit.MINUTE, cooldown_ms=5000)
FIXED_WINDOW_END = RateLimit(10, Unit.MINUTE, cooldown_window_end=True)
LOG = RateLimit(10, Unit.MINUTE, algorithm=AlgorithmName.SLIDING_LOG)
W = 29_000_000  # a window ordinal
S0 = W * 6  # the first span of window W (6 spans per window)
SLACK_MS = 2_000  # Redis time passing between two syncs of one test, at most


@pytest.fixture(params=["memory", "standalone", "cluster"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    async with open_backend(request, request.param) as opened:
        yield opened


@pytest.fixture(params=["standalone", "cluster"])
async def redis_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    async with open_backend(request, request.param) as opened:
        yield opened


def span_push(key: KeyId, count: int, span: int, limit: RateLimit = SLIDING) -> Push:
    return Push(key, span // limit.spans, count, limit, span)


def bucket_push(key: KeyId, count: int, limit: RateLimit = BUCKET, window: int = W) -> Push:
    return Push(key, window, count, limit)


def answers(result: SyncResult) -> list[tuple[int, tuple[int, ...]]]:
    return [(p.total, p.spans) for p in result.pushes]


# --- sliding window -----------------------------------------------------------------------------


async def test_sliding_pushes_answer_the_fleet_window_of_spans(backend: Backend) -> None:
    a, b, key = backend.store("node-a"), backend.store("node-b"), ("d", "k", "slide")
    first = await sync(a, [span_push(key, 2, S0 + 4)])
    second = await sync(b, [span_push(key, 3, S0 + 5)])
    # Span S0+6 opens window W+1: its answer still reaches back into window W.
    third = await sync(a, [span_push(key, 1, S0 + 6)])
    later = await sync(b, [span_push(key, 0, S0 + 9)])
    assert answers(first) == [(2, (0, 0, 0, 0, 0, 2))]
    assert answers(second) == [(5, (0, 0, 0, 0, 2, 3))]
    assert answers(third) == [(6, (0, 0, 0, 2, 3, 1))]
    assert answers(later) == [(6, (2, 3, 1, 0, 0, 0))]


async def test_a_sliding_push_without_a_span_counts_in_its_windows_last_span(
    backend: Backend,
) -> None:
    store, key = backend.store(), ("d", "k", "last")
    await sync(store, [span_push(key, 4, S0 + 5)])
    result = await sync(store, [Push(key, W, 1, SLIDING)])  # span -1: S0 + 5
    assert answers(result) == [(5, (0, 0, 0, 0, 0, 5))]


async def test_a_sliding_window_of_one_span_reads_only_the_pushed_span(
    backend: Backend,
) -> None:
    one = RateLimit(10, Unit.MINUTE, spans=1, algorithm=AlgorithmName.SLIDING_WINDOW)
    store, key = backend.store(), ("d", "k", "one")
    result = await sync(store, [span_push(key, 3, W, one), span_push(key, 4, W + 1, one)])
    assert answers(result) == [(3, (3,)), (4, (4,))]


async def test_sliding_pushes_in_one_batch_and_negative_counts(backend: Backend) -> None:
    store, key = backend.store(), ("d", "k", "many")
    pushes = [span_push(key, 5, S0 + 1), span_push(key, -2, S0 + 1), span_push(key, 4, S0 + 2)]
    result = await sync(store, pushes)
    assert answers(result) == [
        (5, (0, 0, 0, 0, 0, 5)),
        (3, (0, 0, 0, 0, 0, 3)),
        (7, (0, 0, 0, 0, 3, 4)),
    ]


async def test_every_push_also_counts_its_window_for_the_nodes_estimate(
    backend: Backend,
) -> None:
    store, key, other = backend.store(), ("d", "k", "est"), ("d", "k", "bucket-est")
    await sync(store, [span_push(key, 2, S0 + 4), span_push(key, 3, S0 + 6)])
    await sync(store, [bucket_push(other, 4), bucket_push(other, -1)])
    read = await sync(store, totals=[(key, W), (key, W + 1), (other, W)])
    assert read.totals == (2, 3, 3)


async def test_sliding_blocks_only_with_a_cooldown(backend: Backend) -> None:
    store, plain, cool = backend.store(), ("d", "k", "plain"), ("d", "k", "cool")
    result = await sync(
        store,
        [
            span_push(plain, 11, S0),
            span_push(cool, 10, S0, SLIDING_COOL),  # the limit itself: not over
            span_push(cool, 1, S0 + 1, SLIDING_COOL),
        ],
    )
    blocks = [p.block_ms for p in result.pushes]
    assert blocks[:2] == [0, 0] and 4_500 < blocks[2] <= 5_000
    assert [p.total for p in result.pushes] == [11, 10, 11]


async def test_random_pushes_of_three_nodes_match_a_plain_span_model(backend: Backend) -> None:
    rng = random.Random(7)
    nodes = [backend.store(f"node-{i}") for i in range(3)]
    key, counted = ("d", "k", "model"), dict[int, int]()
    for _ in range(12):
        pushes, expected = [], []
        for _ in range(rng.randint(1, 4)):
            span, count = S0 + rng.randint(0, 17), rng.randint(-2, 9)  # three windows
            counted[span] = counted.get(span, 0) + count
            spans = tuple(counted.get(n, 0) for n in range(span - 5, span + 1))
            pushes.append(span_push(key, count, span))
            expected.append((sum(spans), spans))
        assert answers(await sync(rng.choice(nodes), pushes)) == expected


async def test_a_limit_without_a_cooldown_never_reads_a_flag(backend: Backend) -> None:
    # A flag left by the same key under a config with a cooldown (before a reload). Every
    # algorithm alike, a fixed window with `cooldown: window_end` too (its block is the node's
    # own, to its window's end): both stores answer it 0.
    store, key = backend.store(), ("d", "k", "stale")
    crossed = await sync(store, [span_push(key, 11, S0, SLIDING_COOL)])
    after = await sync(
        store,
        [
            span_push(key, 0, S0, SLIDING),
            bucket_push(key, 20),
            bucket_push(key, 0, BUCKET_COOL),
            Push(key, W, 0, FIXED_WINDOW_END),
            Push(key, W, 0, FIXED),
        ],
    )
    assert crossed.pushes[0].block_ms > 4_000
    assert [p.block_ms > 0 for p in after.pushes] == [False, False, True, False, True]


# --- token bucket -------------------------------------------------------------------------------


async def test_bucket_pushes_move_the_debt_and_commute(backend: Backend) -> None:
    store, x, y = backend.store(), ("d", "k", "bx"), ("d", "k", "by")
    pushes = [bucket_push(x, 3), bucket_push(x, 2), bucket_push(y, 2), bucket_push(y, 3)]
    result = await sync(store, pushes)
    # One sync, one store clock per key: 6 s of debt per token, whatever the order.
    assert [p.total for p in result.pushes] == [18_000, 30_000, 12_000, 30_000]
    later = await sync(backend.store("node-b"), [bucket_push(x, 0), bucket_push(y, 1)])
    x_debt, y_debt = (p.total for p in later.pushes)
    assert 30_000 - SLACK_MS <= x_debt <= 30_000  # a read: the debt only shrinks with time
    assert 36_000 - SLACK_MS <= y_debt <= 36_000


async def test_giving_tokens_back_never_moves_the_bucket_before_now(backend: Backend) -> None:
    store, key = backend.store(), ("d", "k", "give")
    pushes = [bucket_push(key, c) for c in (3, -1, -5, 1, 0)]
    result = await sync(store, pushes)
    assert [p.total for p in result.pushes] == [18_000, 12_000, 0, 6_000, 6_000]


async def test_bucket_debt_with_a_fractional_token_time(backend: Backend) -> None:
    store, key = backend.store(), ("d", "k", "odd")
    result = await sync(store, [bucket_push(key, 1, BUCKET_ODD) for _ in range(3)])
    # 60000/7 ms per token, kept to the microsecond: the shared rules' numbers, from any now.
    tat, now, expected = 0.0, now_ms(), []
    for _ in range(3):
        tat = rules.next_tat(tat, now, 1, BUCKET_ODD)
        expected.append(rules.bucket_debt_ms(tat, now))
    assert expected == [8_572, 17_143, 25_715]
    assert [p.total for p in result.pushes] == expected


@pytest.mark.parametrize(
    "limit",
    [
        BUCKET,
        BUCKET_ODD,
        RateLimit(13, Unit.HOUR, burst=5, algorithm=AlgorithmName.TOKEN_BUCKET),
        RateLimit(1000, Unit.SECOND, algorithm=AlgorithmName.TOKEN_BUCKET),
    ],
)
async def test_random_bucket_pushes_match_the_shared_rules(
    backend: Backend, limit: RateLimit
) -> None:
    rng = random.Random(limit.requests_per_unit)
    counts = [rng.randint(-3, 6) for _ in range(20)]
    key = ("d", "k", f"rand{limit.requests_per_unit}")
    result = await sync(backend.store(), [bucket_push(key, c, limit) for c in counts])
    # One sync: one store clock for the key; from an empty bucket the debts do not depend on it.
    tat, now, expected = 0.0, now_ms(), []
    for count in counts:
        tat = rules.next_tat(tat, now, count, limit)
        expected.append(rules.bucket_debt_ms(tat, now))
    assert [p.total for p in result.pushes] == expected


async def test_a_bucket_blocks_past_its_capacity_only_with_a_cooldown(backend: Backend) -> None:
    store, plain, cool = backend.store(), ("d", "k", "bplain"), ("d", "k", "bcool")
    result = await sync(
        store,
        [
            bucket_push(plain, 11),
            bucket_push(cool, 10, BUCKET_COOL),  # exactly full (60 s of debt): not over
            bucket_push(cool, 1, BUCKET_COOL),
        ],
    )
    assert [p.total for p in result.pushes] == [66_000, 60_000, 66_000]
    blocks = [p.block_ms for p in result.pushes]
    assert blocks[:2] == [0, 0] and 4_500 < blocks[2] <= 5_000


# --- mixed batches and errors ---------------------------------------------------------------------


async def test_a_sliding_log_push_fails_alone(backend: Backend) -> None:
    store = backend.store()
    keys = [("d", "k", f"log{i}") for i in range(3)]
    pushes = [Push(keys[0], W, 2, FIXED), Push(keys[1], W, 2, LOG), bucket_push(keys[2], 1)]
    result = await sync(store, pushes, totals=[(keys[1], W)])
    assert [(p.total, bool(p.error)) for p in result.pushes] == [
        (2, False),
        (0, True),
        (6_000, False),
    ]
    assert "sliding_log" in result.pushes[1].error
    assert result.totals == (0,)  # nothing of it was counted


async def test_a_mixed_batch_of_900_keys_lines_up(backend: Backend) -> None:
    store, count = backend.store(), 300
    fixed = [Push(("d", "f", str(i)), W, i % 12 + 1, FIXED) for i in range(count)]
    sliding = [span_push(("d", "s", str(i)), i % 12 + 1, S0 + i % 6) for i in range(count)]
    bucket = [bucket_push(("d", "b", str(i)), i % 12 + 1) for i in range(count)]
    mixed = [p for triple in zip(sliding, bucket, fixed, strict=True) for p in triple]
    result = await sync(store, mixed)
    expected = [(c, (0,) * 5 + (c,), 6_000 * c, c) for c in (i % 12 + 1 for i in range(count))]
    got = [
        (s.total, s.spans, b.total, f.total)
        for s, b, f in zip(*[iter(result.pushes)] * 3, strict=True)
    ]
    assert got == expected
    assert [p.block_ms > 0 for p in result.pushes[2::3]] == [c > 10 for c, *_ in expected]
    assert not any(p.error for p in result.pushes)


# --- Redis only ---------------------------------------------------------------------------------


def redis_store(backend: Backend) -> RedisStorage:
    store = backend.store()
    assert isinstance(store, RedisStorage)
    return store


async def test_span_window_and_bucket_ttls(redis_backend: Backend) -> None:
    store, admin = redis_store(redis_backend), redis_backend.admin
    key, bucket = ("d", "k", "ttl"), ("d", "k", "bttl")
    await sync(store, [span_push(key, 1, S0 + 2), bucket_push(bucket, 3)])
    tag, bucket_tag = store.keys.tag(key), store.keys.tag(bucket)
    span_ttl = admin.pttl(tag + span_suffix(key, S0 + 2))
    window_ttls = [
        admin.pttl(tag + counter_suffix(key, W)),
        admin.pttl(store.keys.counter(bucket, W)),
    ]
    bucket_ttl = admin.pttl(bucket_tag + bucket_suffix(bucket))
    assert rules.span_ttl_ms(SLIDING) == 80_000  # one window and two 10 s spans
    assert 79_000 < span_ttl <= 80_000
    assert all(119_000 < ttl <= 120_000 for ttl in window_ttls)
    assert 17_000 < bucket_ttl <= 18_000  # until the bucket is full again
    stored = float(admin.get(bucket_tag + bucket_suffix(bucket)))
    assert abs(stored - (now_ms() + 18_000)) < SLACK_MS  # epoch ms of the TAT


async def test_a_bucket_read_writes_no_state(redis_backend: Backend) -> None:
    store, admin = redis_store(redis_backend), redis_backend.admin
    key, idle = ("d", "k", "bread"), ("d", "k", "bidle")
    await sync(store, [bucket_push(key, 2)])
    ttl_before = admin.pttl(store.keys.tag(key) + bucket_suffix(key))
    read = await sync(store, [bucket_push(key, 0), bucket_push(idle, 0)])
    assert admin.pttl(store.keys.tag(key) + bucket_suffix(key)) <= ttl_before
    assert not admin.exists(store.keys.tag(idle) + bucket_suffix(idle))
    assert 12_000 - SLACK_MS <= read.pushes[0].total <= 12_000 and read.pushes[1].total == 0


async def test_a_key_of_the_wrong_type_fails_alone_for_every_algorithm(
    redis_backend: Backend,
) -> None:
    store, admin = redis_store(redis_backend), redis_backend.admin
    keys = [("d", "k", f"wrong{i}") for i in range(4)]
    admin.hset(store.keys.tag(keys[1]) + span_suffix(keys[1], S0), "f", "x")
    admin.hset(store.keys.tag(keys[3]) + bucket_suffix(keys[3]), "f", "x")
    pushes = [
        span_push(keys[0], 1, S0),
        span_push(keys[1], 1, S0),
        bucket_push(keys[2], 1),
        bucket_push(keys[3], 1),
    ]
    result = await sync(store, pushes, totals=[(keys[1], W), (keys[3], W)])
    assert [(p.total, p.error[:9]) for p in result.pushes] == [
        (1, ""),
        (0, "WRONGTYPE"),
        (6_000, ""),
        (0, "WRONGTYPE"),
    ]
    assert result.totals == (0, 0)  # not applied: the window counters were not touched either


async def test_an_unreadable_bucket_state_fails_alone(redis_backend: Backend) -> None:
    store, admin = redis_store(redis_backend), redis_backend.admin
    keys = [("d", "k", "garbled"), ("d", "k", "fine")]
    admin.set(store.keys.tag(keys[0]) + bucket_suffix(keys[0]), "soon")
    result = await sync(store, [bucket_push(k, 1) for k in keys])
    assert [p.error for p in result.pushes] == ["not a token bucket state", ""]


async def test_the_new_scripts_are_reloaded_after_a_flush(redis_backend: Backend) -> None:
    store, key = redis_store(redis_backend), ("d", "k", "flush")
    await sync(store, [span_push(key, 1, S0), bucket_push(key, 1)])
    redis_backend.admin.script_flush()
    result = await sync(store, [span_push(key, 1, S0), bucket_push(key, 0)])
    assert result.pushes[0].spans[-1] == 2
    assert 6_000 - SLACK_MS <= result.pushes[1].total <= 6_000


async def test_one_round_trip_per_sync_with_every_algorithm(redis_server: Any) -> None:
    store = open_redis(f"{redis_server.url}?{PATIENT}", f"t{uuid.uuid4().hex[:8]}:", "node-a")
    keys = [("d", "k", str(i)) for i in range(4)]
    pushes = [
        *(Push(k, W, 1, FIXED) for k in keys),
        *(span_push(k, 1, S0) for k in keys),
        *(bucket_push(k, 1) for k in keys),
    ]
    try:
        with redis_server.client() as admin:
            await sync(store, pushes)  # connects and caches the scripts
            before = server_stats(admin)
            for _ in range(3):
                await sync(store, pushes)
            after = server_stats(admin)
    finally:
        await store.close()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert delta["total_reads_processed"] == 3 + 1  # one packet per sync, plus the INFO
    assert delta["cmdstat_evalsha"] == 3 * 3  # one script call per algorithm
    assert delta.get("cmdstat_eval") == 3  # the heartbeat's script, no NOSCRIPT reload


async def test_cluster_calls_group_by_slot_and_algorithm(redis_cluster: Any) -> None:
    store = open_redis(f"{redis_cluster.url}?{PATIENT}", f"t{uuid.uuid4().hex[:8]}:", "node-a")
    keys = [("d", "k", str(i)) for i in range(20)]  # spread over the three masters
    # Each limit of a descriptor has a key id of its own (core: limit_key), as here.
    mixed = [
        p
        for k in keys
        for p in (
            Push((*k, "fixed"), W, 1, FIXED),
            span_push((*k, "sliding"), 2, S0 + 3),
            bucket_push((*k, "bucket"), 3),
            Push((*k, "log"), W, 1, LOG),
        )
    ]
    reads = [(p.key, W) for p in mixed]
    try:
        result = await sync(store, mixed)
        # Read in a later sync: in the first one, a server that did not know a script yet
        # answers the reads before the script's second trip runs it.
        read = await sync(store, totals=reads)
    finally:
        await store.close()
    expected = [
        PushResult(1, 0),
        PushResult(2, 0, spans=(0, 0, 0, 0, 0, 2)),
        PushResult(18_000, 0),
    ]
    assert [p for i, p in enumerate(result.pushes) if i % 4 != 3] == expected * len(keys)
    assert all(p.error for p in result.pushes[3::4])
    # Every applied push also counted its window; the refused sliding log push did not.
    assert read.totals == (1, 2, 3, 0) * len(keys)

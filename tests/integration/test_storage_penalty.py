"""The store's half of progressive penalties (sync_common.lua, and MemoryStorage's copy) against
the rule of core/penalty.py, for every algorithm's sync script and every backend: a block starts
at the key's level for `block_ms(level)`, an offence report raises the level to what it asks
(never lowers it), and the level expires `forgive_after` after the last report."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from ratelimit_sidecar.config.model import AlgorithmName, Penalty, RateLimit, Unit
from ratelimit_sidecar.core.penalty import block_ms, grace_ms
from ratelimit_sidecar.core.types import Push, PushResult
from ratelimit_sidecar.storage.keys import digest
from ratelimit_sidecar.storage.redis_urls import open_redis
from ratelimit_sidecar.storage.strict_store import StrictCheck, StrictStore
from tests.integration.test_storage_contract import Backend, now_ms, open_backend, sync

pytestmark = pytest.mark.integration

PENALTY = Penalty(factor=2.0, max_ms=400, forgive_after_ms=60_000)
COOLDOWN = 100
LIMITS = {
    "fixed": RateLimit(2, Unit.MINUTE, cooldown_ms=COOLDOWN, penalty=PENALTY),
    "sliding": RateLimit(
        2,
        Unit.MINUTE,
        cooldown_ms=COOLDOWN,
        algorithm=AlgorithmName.SLIDING_WINDOW,
        penalty=PENALTY,
    ),
    "bucket": RateLimit(
        2,
        Unit.MINUTE,
        cooldown_ms=COOLDOWN,
        algorithm=AlgorithmName.TOKEN_BUCKET,
        penalty=PENALTY,
    ),
}


@pytest.fixture(params=["memory", "standalone", "cluster"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    async with open_backend(request, request.param) as opened:
        yield opened


async def _push(
    backend: Backend,
    limit: RateLimit,
    key: tuple[str, ...],
    wanted: int,
    blocking: int = -1,
    count: int = 3,  # 3 > MAX 2: over, every time
) -> PushResult:
    now = now_ms()
    window = now // limit.window_ms
    span = now // (limit.window_ms // limit.spans)
    push = Push(key, window, count, limit, span, wanted, blocking)
    (answer,) = (await sync(backend.stores[0], [push])).pushes
    assert not answer.error
    return answer


@pytest.mark.parametrize("algorithm", sorted(LIMITS))
async def test_blocks_grow_with_the_level_the_offences_ask_for(
    backend: Backend, algorithm: str
) -> None:
    limit, key = LIMITS[algorithm], ("d", "k", uuid.uuid4().hex)
    backend.store()
    first = await _push(backend, limit, key, 0)
    assert (first.level, first.block_level) == (0, 0)
    assert COOLDOWN - 50 < first.block_ms <= COOLDOWN
    for level in (1, 2, 3, 4):
        raised = await _push(backend, limit, key, level)  # an offence while blocked
        assert (raised.level, raised.block_level) == (level, level - 1)
        await asyncio.sleep(block_ms(COOLDOWN, PENALTY, level - 1) / 1000 + 0.02)
        blocked = await _push(backend, limit, key, 0)  # the next block, at the new level
        expected = block_ms(COOLDOWN, PENALTY, level)
        assert (blocked.level, blocked.block_level) == (level, level)
        assert expected - 60 < blocked.block_ms <= expected
    lower = await _push(backend, limit, key, 1)  # a late report of an old offence
    assert lower.level == 4


@pytest.mark.parametrize("algorithm", sorted(LIMITS))
async def test_a_block_from_a_node_blocking_alone_keeps_that_block_level(
    backend: Backend, algorithm: str
) -> None:
    limit, key = LIMITS[algorithm], ("d", "k", uuid.uuid4().hex)
    backend.store()
    raised = await _push(backend, limit, key, 1, count=0)  # an offence in the node's own block
    assert (raised.level, raised.block_ms) == (1, 0)
    for blocking, level in ((0, 0), (-1, 1)):  # core/penalty.py flag_level
        other = ("d", "k", uuid.uuid4().hex)
        await _push(backend, limit, other, 1, count=0)
        answer = await _push(backend, limit, other, 0, blocking)
        expected = block_ms(COOLDOWN, PENALTY, level)
        assert (answer.level, answer.block_level) == (1, level)
        assert expected - 60 < answer.block_ms <= expected


@pytest.fixture(params=["standalone", "cluster"])
async def redis_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    async with open_backend(request, request.param) as opened:
        yield opened


async def test_the_level_lives_forgive_after_from_the_last_report(redis_backend: Backend) -> None:
    limit, key = LIMITS["fixed"], ("d", "k", uuid.uuid4().hex)
    redis_backend.store()
    await _push(redis_backend, limit, key, 2)
    (name,) = list(redis_backend.admin.scan_iter(match=f"*{{{digest(key)}}}:penalty"))
    assert redis_backend.admin.get(name) == b"2"
    ttl = redis_backend.admin.pttl(name)
    assert PENALTY.forgive_after_ms - 5_000 < ttl <= PENALTY.forgive_after_ms
    redis_backend.admin.pexpire(name, 1_000)
    await _push(redis_backend, limit, key, 1)  # any report renews it, none lowers it
    assert redis_backend.admin.get(name) == b"2"
    assert redis_backend.admin.pttl(name) > 5_000


# --- strict.lua: the store decides offences itself, on Redis time ---------------------------


@pytest.fixture(params=["standalone", "cluster"])
async def strict_store(request: pytest.FixtureRequest) -> AsyncIterator[StrictStore]:
    where = request.getfixturevalue(
        "redis_server" if request.param == "standalone" else "redis_cluster"
    )
    storage = open_redis(where.url, prefix=f"t{uuid.uuid4().hex[:8]}:")
    try:
        yield StrictStore(storage)
    finally:
        await storage.close()


PENALTY_STRICT = Penalty(2.0, 1600, 60_000)
STRICT = RateLimit(2, Unit.HOUR, cooldown_ms=400, strict=True, penalty=PENALTY_STRICT)


async def _strict(store: StrictStore, key: tuple[str, ...]) -> tuple[bool, int, int]:
    """One strict request: (admitted, the flag's ms left, the key's level)."""
    (answer,) = await store.check([StrictCheck(key, STRICT, 1, False)])
    left = await store.client.pttl(store.keys.flag(key))
    level = await store.client.get(store.keys.tag(key) + ":penalty")
    return answer.fits, max(0, left), int(level or 0)


async def test_a_strict_block_grows_for_a_hammering_client(strict_store: StrictStore) -> None:
    key = ("strict", "user", uuid.uuid4().hex)
    assert [(await _strict(strict_store, key))[0] for _ in range(2)] == [True, True]
    fits, left, level = await _strict(strict_store, key)  # over: a block at level 0
    assert not fits and 300 < left <= 400 and level == 0
    assert (await _strict(strict_store, key))[2] == 0  # in flight with the first refusal
    for expected in (1, 2, 2):  # the top level is 2: 400 x 2^2 = 1600 = max
        await asyncio.sleep(grace_ms(STRICT.cooldown) / 1000 + 0.02)
        assert (await _strict(strict_store, key))[2] == expected  # an offence
        await asyncio.sleep(left / 1000 + 0.02)  # the block is over; the window still is
        fits, left, level = await _strict(strict_store, key)
        length = block_ms(STRICT.cooldown, PENALTY_STRICT, expected)
        assert not fits and length - 100 < left <= length and level == expected


async def test_a_strict_client_waiting_out_its_blocks_is_never_penalised(
    strict_store: StrictStore,
) -> None:
    key = ("strict", "user", uuid.uuid4().hex)
    for _ in range(3):
        await _strict(strict_store, key)
    for _ in range(3):
        fits, left, level = await _strict(strict_store, key)
        assert not fits and level == 0 and 0 < left <= STRICT.cooldown
        await asyncio.sleep(left / 1000 + 0.02)  # exactly until the block ends

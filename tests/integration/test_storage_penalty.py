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
from ratelimit_sidecar.core.penalty import block_ms
from ratelimit_sidecar.core.types import Push, PushResult
from ratelimit_sidecar.storage.keys import digest
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
    backend: Backend, limit: RateLimit, key: tuple[str, ...], wanted: int
) -> PushResult:
    now = now_ms()
    window = now // limit.window_ms
    span = now // (limit.window_ms // limit.spans)
    push = Push(key, window, 3, limit, span, wanted)  # 3 > MAX 2: over, every time
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

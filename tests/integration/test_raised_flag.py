"""A block flag set for a lower limit than a push or a strict check now carries (a runtime
override or a reload raised it) is lifted by the store: every sync script, strict.lua and
MemoryStorage follow storage/shared_rules.py `lifted`; a lowered or unchanged limit keeps it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from ratelimit_sidecar.config.model import AlgorithmName, Penalty, RateLimit, Unit
from ratelimit_sidecar.core.types import Push, PushResult
from ratelimit_sidecar.storage.redis_store import RedisStorage
from ratelimit_sidecar.storage.redis_urls import open_redis
from ratelimit_sidecar.storage.strict_store import StrictAnswer, StrictCheck, StrictStore
from tests.integration.test_storage_contract import Backend, now_ms, open_backend, sync

pytestmark = pytest.mark.integration

PENALTY = Penalty(factor=2.0, max_ms=20_000, forgive_after_ms=60_000)
COOLDOWN = 5_000
ALGORITHMS = {
    "fixed": AlgorithmName.FIXED_WINDOW,
    "sliding": AlgorithmName.SLIDING_WINDOW,
    "bucket": AlgorithmName.TOKEN_BUCKET,
}


@pytest.fixture(params=["memory", "standalone", "cluster"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    async with open_backend(request, request.param) as opened:
        yield opened


def _low(algorithm: str, penalised: bool) -> RateLimit:
    # burst 1000: the raised bucket's capacity holds the debt the low one left
    return RateLimit(
        3,
        Unit.MINUTE,
        cooldown_ms=COOLDOWN,
        algorithm=ALGORITHMS[algorithm],
        burst=1000 if algorithm == "bucket" else 0,
        penalty=PENALTY if penalised else None,
    )


async def _push(backend: Backend, key: tuple[str, ...], limit: RateLimit, count: int) -> PushResult:
    now = now_ms()
    span = now // (limit.window_ms // limit.spans)
    push = Push(key, now // limit.window_ms, count, limit, span)
    (answer,) = (await sync(backend.stores[0], [push])).pushes
    assert not answer.error
    return answer


@pytest.mark.parametrize("penalised", [False, True], ids=["plain", "penalised"])
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
async def test_a_raised_limit_lifts_the_flag_a_lower_one_set(
    backend: Backend, algorithm: str, penalised: bool
) -> None:
    backend.store()
    key, low = ("d", "k", uuid.uuid4().hex), _low(algorithm, penalised)
    raised = replace(low, requests_per_unit=100)
    if algorithm == "bucket":  # the bucket's capacity is its burst: a raise of both
        low = replace(low, burst=3)

    assert (await _push(backend, key, low, 6)).block_ms > 0  # 6 > 3: blocked
    assert (await _push(backend, key, replace(low, requests_per_unit=2), 0)).block_ms > 0
    assert (await _push(backend, key, low, 0)).block_ms > 0  # unchanged: still blocked

    assert (await _push(backend, key, raised, 1)).block_ms == 0  # lifted
    assert (await _push(backend, key, raised, 0)).block_ms == 0
    crossing = await _push(backend, key, raised, 2000)  # over the raised limit: a new block
    assert crossing.block_ms > 0
    assert (await _push(backend, key, raised, 0)).block_ms > 0  # and it holds at 100


class Strict:
    """A strict store and the eventual sync's store on the same Redis and prefix."""

    def __init__(self, storage: RedisStorage) -> None:
        self.storage, self.strict = storage, StrictStore(storage)

    async def check(self, key: tuple[str, ...], limit: RateLimit, hits: int) -> StrictAnswer:
        (answer,) = await self.strict.check([StrictCheck(key, limit, hits, False)])
        return answer


@pytest.fixture(params=["standalone", "cluster"])
async def strict(request: pytest.FixtureRequest) -> AsyncIterator[Strict]:
    where = request.getfixturevalue(
        "redis_server" if request.param == "standalone" else "redis_cluster"
    )
    storage = open_redis(where.url, prefix=f"f{uuid.uuid4().hex[:8]}:")
    try:
        yield Strict(storage)
    finally:
        await storage.close()


@pytest.mark.parametrize("penalised", [False, True], ids=["plain", "penalised"])
async def test_a_strict_check_at_a_raised_limit_is_not_refused_by_the_lower_ones_block(
    strict: Strict, penalised: bool
) -> None:
    key = ("d", "k", uuid.uuid4().hex)
    low = replace(_low("fixed", penalised), strict=True)
    raised = replace(low, requests_per_unit=100)

    answers = [await strict.check(key, low, 1) for _ in range(4)]
    assert [a.fits for a in answers] == [True, True, True, False]  # the 4th starts the block
    assert not (await strict.check(key, replace(low, requests_per_unit=2), 0)).fits

    admitted = await strict.check(key, raised, 1)
    assert admitted.fits and admitted.remaining == 96
    assert (await strict.check(key, raised, 0)).fits  # and the flag is gone
    assert not (await strict.check(key, low, 1)).fits  # 5 > 3 at the low limit, as before


async def test_a_strict_check_lifts_a_block_an_eventual_sync_set(strict: Strict) -> None:
    """One flag for both paths: a strict limit raised past it is not blocked."""
    key, low = ("d", "k", uuid.uuid4().hex), _low("fixed", False)
    now = now_ms()
    push = Push(key, now // low.window_ms, 6, low, now // (low.window_ms // low.spans))
    (crossed,) = (await sync(strict.storage, [push])).pushes
    assert crossed.block_ms > 0
    assert (await strict.check(key, replace(low, requests_per_unit=100, strict=True), 1)).fits

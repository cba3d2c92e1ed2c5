"""Blocks announced by Redis itself (standalone, Cluster and Sentinel): the sync scripts and
strict.lua publish each block they start, once, and a subscribed node receives it from any
Cluster node."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import quote

import pytest
from redis.crc import key_slot

from harness.redis_servers import ServerProcess
from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Unit
from ratelimit_sidecar.core.types import KeyId, Push, SyncBatch
from ratelimit_sidecar.storage.blocks import BLOCKS, BlockNotice, parse_notice
from ratelimit_sidecar.storage.keys import digest
from ratelimit_sidecar.storage.redis_store import RedisStorage
from ratelimit_sidecar.storage.redis_urls import open_redis
from ratelimit_sidecar.storage.strict_store import StrictCheck, StrictStore
from ratelimit_sidecar.storage.subscriber import Subscriber
from tests.integration.conftest import ACL_PASSWORD, ACL_USER

pytestmark = pytest.mark.integration

WAIT_S = 5.0
COOLDOWN_MS = 3000


def limit(algorithm: AlgorithmName) -> RateLimit:
    return RateLimit(5, Unit.MINUTE, algorithm=algorithm, cooldown_ms=COOLDOWN_MS)


@dataclass
class Listening:
    storage: RedisStorage
    notices: list[BlockNotice]


FIXTURES = {"standalone": "redis_server", "cluster": "redis_cluster", "sentinel": "redis_sentinel"}


@pytest.fixture(params=list(FIXTURES))
async def listening(request: pytest.FixtureRequest) -> AsyncIterator[Listening]:
    """A store with its own prefix, and a subscriber of its blocks channel on its own client."""
    url = request.getfixturevalue(FIXTURES[request.param]).url
    prefix = f"b{uuid.uuid4().hex[:8]}:"
    storage, listener = open_redis(url, prefix=prefix), open_redis(url, prefix=prefix)
    subscriber = Subscriber(listener.client, retry_s=0.05, quiet_s=0.5)
    notices: list[BlockNotice] = []
    subscriber.on(storage.keys.channel(BLOCKS), lambda data: notices.append(notice_of(data)))
    task = asyncio.create_task(subscriber.run())
    try:
        await eventually(lambda: subscriber.connected)
        yield Listening(storage, notices)
    finally:
        subscriber.stop()
        await asyncio.wait_for(task, WAIT_S)
        await storage.close()
        await listener.close()


def notice_of(data: bytes) -> BlockNotice:
    notice = parse_notice(data)
    assert notice is not None, data
    return notice


async def eventually(check: object, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def keys_on_every_slot_range(count: int) -> list[KeyId]:
    """`count` keys whose digests fall in different thirds of the slots (a 3-master Cluster
    runs their scripts on different nodes)."""
    found: dict[int, KeyId] = {}
    n = 0
    while len(found) < count:
        key = ("notice", "user", f"{uuid.uuid4().hex[:6]}-{n}")
        found.setdefault(key_slot(digest(key).encode()) * count // 16384, key)
        n += 1
    return list(found.values())


async def push(storage: RedisStorage, pushes: list[Push]) -> None:
    now = int(time.time() * 1000)
    result = await storage.sync(SyncBatch(now, pushes=pushes))
    assert not [p.error for p in result.pushes if p.error]


@pytest.mark.parametrize("algorithm", list(AlgorithmName)[:3])
async def test_a_crossing_push_announces_its_block_once(
    listening: Listening, algorithm: AlgorithmName
) -> None:
    keys = keys_on_every_slot_range(3)
    lim = limit(algorithm)
    window = int(time.time() * 1000) // lim.window_ms
    await push(listening.storage, [Push(k, window, 3, lim) for k in keys])  # under MAX
    await asyncio.sleep(0.1)
    assert listening.notices == []
    await push(listening.storage, [Push(k, window, 10, lim) for k in keys])  # crosses
    await push(listening.storage, [Push(k, window, 1, lim) for k in keys])  # still over
    await eventually(lambda: len(listening.notices) >= len(keys))
    await asyncio.sleep(0.1)
    assert sorted(n.digest for n in listening.notices) == sorted(digest(k) for k in keys)
    assert all(n.left_ms == COOLDOWN_MS and n.level == 0 for n in listening.notices)
    assert {n.set_for for n in listening.notices} == {lim.requests_per_unit}  # what it was for


async def test_a_strict_refusal_announces_its_block(listening: Listening) -> None:
    strict = StrictStore(listening.storage)
    key, lim = keys_on_every_slot_range(1)[0], limit(AlgorithmName.FIXED_WINDOW)
    (admitted,) = await strict.check([StrictCheck(key, lim, 5, False)])
    (refused,) = await strict.check([StrictCheck(key, lim, 1, False)])
    assert admitted.fits and not refused.fits
    await eventually(lambda: len(listening.notices) == 1)
    assert listening.notices == [BlockNotice(digest(key), COOLDOWN_MS, 0, lim.requests_per_unit)]


async def test_a_user_without_rights_on_the_channel_still_syncs_and_blocks(
    redis_server: ServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis 7 gives a new ACL user no channels: the announcement fails inside the script
    (pcall) without failing the push, and the subscriber says once that it cannot subscribe;
    the node learns blocks at span ends, as before."""
    password = quote(ACL_PASSWORD, safe="")
    url = f"redis://{ACL_USER}:{password}@127.0.0.1:{redis_server.port}/0"
    storage = open_redis(url, prefix=f"b{uuid.uuid4().hex[:8]}:")
    subscriber = Subscriber(storage.client, retry_s=0.05, quiet_s=0.5)
    subscriber.on(storage.keys.channel(BLOCKS), lambda _data: None)
    task = asyncio.create_task(subscriber.run())
    try:
        key, lim = keys_on_every_slot_range(1)[0], limit(AlgorithmName.FIXED_WINDOW)
        window = int(time.time() * 1000) // lim.window_ms
        now = int(time.time() * 1000)
        result = await storage.sync(SyncBatch(now, pushes=[Push(key, window, 10, lim)]))
        (answer,) = result.pushes
        assert not answer.error and answer.block_ms > 0  # counted and blocked all the same
        (refused,) = await StrictStore(storage).check([StrictCheck(key, lim, 1, False)])
        assert not refused.fits
        await asyncio.sleep(0.5)
        assert not subscriber.connected
    finally:
        subscriber.stop()
        await asyncio.wait_for(task, WAIT_S)
        await storage.close()
    failures = [r for r in caplog.records if "cannot subscribe" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in caplog.records]

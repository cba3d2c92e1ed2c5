"""The override store contract: one table of behaviours, run against every override store.

MemoryOverrideStore is the reference; the file store (`--state-dir`) and RedisOverrideStore, on
standalone Redis, Cluster (3 masters) and Sentinel, must answer the same. Redis-only checks (key
slots, the announcement, sharing between nodes, failures) follow the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis.crc import key_slot

from harness.redis_servers import ServerProcess
from ratelimit_sidecar.overrides.file_store import FileOverrideStore
from ratelimit_sidecar.overrides.redis_store import RedisOverrideStore
from ratelimit_sidecar.overrides.store import (
    HISTORY,
    MemoryOverrideStore,
    OverrideStore,
    UnknownVersion,
)
from ratelimit_sidecar.storage.errors import StoreError, StoreRefused, StoreUnavailable
from ratelimit_sidecar.storage.redis_urls import open_redis

pytestmark = pytest.mark.integration

PATIENT = "socket_timeout=3&socket_connect_timeout=3"  # results, not latency, are tested here


@dataclass
class Backend:
    name: str
    make: Callable[[], OverrideStore]  # another handle on the same set (another node's)
    admin: Any = None  # a synchronous redis-py client on the same data; None for memory
    stores: list[OverrideStore] = field(default_factory=list)

    def store(self) -> OverrideStore:
        self.stores.append(self.make())
        return self.stores[-1]


class OpenedStore(RedisOverrideStore):
    """A store on a client of its own: closing it closes every connection opened for it
    (Sentinel's to the sentinels too)."""

    def __init__(self, url: str, prefix: str) -> None:
        self.storage = open_redis(url, prefix)
        storage = self.storage
        super().__init__(storage.client, storage.keys, storage.description, owns=False)

    async def close(self) -> None:
        await self.storage.close()


def redis_store(url: str, prefix: str) -> RedisOverrideStore:
    return OpenedStore(url, prefix)


@contextlib.asynccontextmanager
async def open_backend(request: pytest.FixtureRequest, name: str) -> AsyncIterator[Backend]:
    if name == "memory":
        shared = MemoryOverrideStore()
        yield Backend(name, lambda: shared)
        return
    if name == "file":  # each handle a process of its own on one state dir (workers)
        state_dir = str(request.getfixturevalue("tmp_path"))
        yield Backend(name, lambda: FileOverrideStore(state_dir))
        return
    if name == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        url, admin = f"{cluster.url}?{PATIENT}", cluster.client()
    elif name == "sentinel":
        sentinel = request.getfixturevalue("redis_sentinel")
        url, admin = f"{sentinel.url}?{PATIENT}", sentinel.master.client()
    else:
        server = request.getfixturevalue("redis_server")
        url, admin = f"{server.url}?{PATIENT}", server.client()
    prefix = f"o{uuid.uuid4().hex[:8]}:"  # isolates tests sharing a server
    backend = Backend(name, lambda: redis_store(url, prefix), admin)
    try:
        yield backend
    finally:
        for store in backend.stores:
            await store.close()
        admin.close()


REDIS_BACKENDS = ["standalone", "cluster", "sentinel"]


@pytest.fixture(params=["memory", "file", *REDIS_BACKENDS])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    async with open_backend(request, request.param) as opened:
        yield opened


@pytest.fixture(params=REDIS_BACKENDS)
async def redis_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    async with open_backend(request, request.param) as opened:
        yield opened


def doc(override_id: str, per_minute: int, **extra: object) -> dict[str, object]:
    return {
        "id": override_id,
        "domain": "gateway",
        "descriptor": [{"key": "api_key", "value": override_id}],
        "rate_limit": {"unit": "minute", "requests_per_unit": per_minute},
        **extra,
    }


# --- the behaviour table: every store -----------------------------------------------------------


async def test_an_empty_store_is_version_zero(backend: Backend) -> None:
    snapshot = await backend.store().read()
    assert (snapshot.version, dict(snapshot.documents)) == (0, {})
    assert await backend.store().history() == ()


async def test_puts_create_and_replace_one_version_each(backend: Backend) -> None:
    store = backend.store()
    assert await store.put(doc("a", 10), 1) == 1
    assert await store.put(doc("b", 5), 2) == 2
    assert await store.put(doc("a", 20), 3) == 3
    snapshot = await store.read()
    assert snapshot.version == 3
    assert dict(snapshot.documents) == {"a": doc("a", 20), "b": doc("b", 5)}


async def test_deleting_is_a_version_and_an_absent_id_is_none(backend: Backend) -> None:
    store = backend.store()
    await store.put(doc("a", 10), 1)
    assert await store.delete("missing", 2) is None
    assert await store.delete("a", 3) == 2
    assert await store.delete("a", 4) is None
    assert (await store.read()).version == 2
    assert dict((await store.read()).documents) == {}


async def test_history_records_every_change_newest_first(backend: Backend) -> None:
    store = backend.store()
    await store.put(doc("a", 10), 1000)
    await store.put(doc("a", 20), 2000)
    await store.delete("a", 3000)
    changes = await store.history()
    assert [(c.version, c.time_ms, c.action) for c in changes] == [
        (3, 3000, "delete"),
        (2, 2000, "put"),
        (1, 1000, "put"),
    ]
    assert changes[0].touched == (("a", doc("a", 20), None),)
    assert changes[1].touched == (("a", doc("a", 10), doc("a", 20)),)
    assert changes[2].touched == (("a", None, doc("a", 10)),)


async def test_history_keeps_the_last_hundred(backend: Backend) -> None:
    store = backend.store()
    for n in range(HISTORY + 5):
        await store.put(doc("a", n + 1), n)
    changes = await store.history()
    assert [c.version for c in changes] == list(range(HISTORY + 5, 5, -1))
    with pytest.raises(UnknownVersion):
        await store.rollback(3, 999)
    assert await store.rollback(5, 999) == HISTORY + 6  # the oldest the history reaches


async def test_rollback_restores_a_version_as_a_new_one(backend: Backend) -> None:
    store = backend.store()
    await store.put(doc("a", 10), 1)
    await store.put(doc("b", 5), 2)  # version 2: a=10, b=5
    await store.put(doc("a", 99), 3)
    await store.delete("b", 4)
    assert await store.rollback(2, 5) == 5
    assert dict((await store.read()).documents) == {"a": doc("a", 10), "b": doc("b", 5)}
    last = (await store.history())[0]
    assert (last.action, last.time_ms) == ("rollback", 5)
    assert last.touched == (("a", doc("a", 99), doc("a", 10)), ("b", None, doc("b", 5)))
    assert await store.rollback(4, 6) == 6  # a rollback can itself be undone
    assert dict((await store.read()).documents) == {"a": doc("a", 99)}
    assert await store.rollback(0, 7) == 7
    assert dict((await store.read()).documents) == {}


async def test_rollback_to_an_unknown_version_changes_nothing(backend: Backend) -> None:
    store = backend.store()
    await store.put(doc("a", 10), 1)
    for version in (2, -1):
        with pytest.raises(UnknownVersion):
            await store.rollback(version, 2)
    assert (await store.read()).version == 1


async def test_documents_come_back_as_they_were_put(backend: Backend) -> None:
    store = backend.store()
    odd = doc(
        'quote"back\\slash',
        7,
        note="é🙂 \t\n{}|:[]",
        expires_at="2026-12-01T00:00:00Z",
        nested={"list": [1, 2.5, None, True], "big": 2**62},
    )
    await store.put(odd, 1)
    assert dict((await store.read()).documents) == {odd["id"]: odd}
    assert (await store.history())[0].touched == ((odd["id"], None, odd),)


async def test_every_handle_sees_one_set(backend: Backend) -> None:
    writer, reader = backend.store(), backend.store()
    await writer.put(doc("a", 10), 1)
    await reader.put(doc("b", 10), 2)
    snapshot = await writer.read()
    assert (snapshot.version, sorted(snapshot.documents)) == (2, ["a", "b"])
    assert [c.version for c in await reader.history()] == [2, 1]


async def test_concurrent_writes_each_get_their_own_version(backend: Backend) -> None:
    # The file store takes one writer per state dir at a time (one handle, its lock): handles
    # writing at once there would race for the file, as workers on one dir would.
    handles = 1 if backend.name == "file" else 4
    stores = [backend.store() for _ in range(handles)] * (4 // handles)
    versions = await asyncio.gather(
        *(s.put(doc(f"id{i % 4}", i + 1), i) for i, s in enumerate(stores * 5))
    )
    assert sorted(versions) == list(range(1, 21))
    assert len((await stores[0].read()).documents) == 4


# --- Redis only ---------------------------------------------------------------------------------


async def test_keys_share_one_slot_under_the_prefix(redis_backend: Backend) -> None:
    store = redis_backend.store()
    assert isinstance(store, RedisOverrideStore)
    await store.put(doc("a", 10), 1)
    names = [store.keys.overrides(part) for part in ("set", "version", "history")]
    assert all(name.startswith(store.keys.prefix) for name in names)
    assert len({key_slot(name.encode()) for name in names}) == 1
    assert redis_backend.admin.exists(*names) == 3
    assert redis_backend.admin.hget(names[0], "a") is not None


async def test_a_write_announces_its_version_and_redis_time(redis_backend: Backend) -> None:
    store = redis_backend.store()
    assert isinstance(store, RedisOverrideStore)
    pubsub = redis_backend.admin.pubsub()
    pubsub.subscribe(store.channel)
    try:
        assert pubsub.get_message(timeout=3)["type"] == "subscribe"
        version = await store.put(doc("a", 10), 1)
        message = pubsub.get_message(timeout=3)
        assert message is not None and message["type"] == "message"
        announced, written_ms = message["data"].decode().split("|")
        assert int(announced) == version
        assert int(written_ms) == store.last_write_ms
        redis_now = redis_backend.admin.time()
        assert 0 <= redis_now[0] * 1000 + redis_now[1] // 1000 - int(written_ms) < 5000
        assert await store.delete("absent", 2) is None
        assert pubsub.get_message(timeout=0.2) is None  # nothing written, nothing announced
    finally:
        pubsub.close()


async def test_a_stale_conditional_write_changes_nothing(redis_backend: Backend) -> None:
    store = redis_backend.store()
    assert isinstance(store, RedisOverrideStore)
    await store.put(doc("a", 10), 1)
    assert await store._write("rollback", (("a", None, None),), 2, expected=0) is None
    assert (await store.read()).version == 1


async def test_what_redis_refuses_or_cannot_hold_is_a_store_error(redis_backend: Backend) -> None:
    store = redis_backend.store()
    assert isinstance(store, RedisOverrideStore)
    redis_backend.admin.set(store.keys.overrides("set"), "not a hash")
    with pytest.raises(StoreRefused):
        await store.put(doc("a", 10), 1)
    redis_backend.admin.delete(store.keys.overrides("set"))
    redis_backend.admin.hset(store.keys.overrides("set"), "a", "{not json")
    with pytest.raises(StoreError):
        await store.read()


async def test_an_unreachable_redis_is_unavailable(own_redis_server: ServerProcess) -> None:
    store = redis_store(own_redis_server.url, "down:")
    try:
        await store.put(doc("a", 10), 1)
        own_redis_server.kill()
        await asyncio.sleep(0.1)  # the event loop sees the connection closed
        for _ in range(2):  # its pooled connection is found closed before anything is sent
            with pytest.raises(StoreUnavailable):
                await store.put(doc("a", 20), 2)
        with pytest.raises(StoreError):
            await store.read()
    finally:
        await store.close()


async def test_a_redis_that_lost_the_set_gets_back_the_last_one_read(
    own_redis_server: ServerProcess,
) -> None:
    """Without persistence a restart empties Redis: the first node to read puts its last set
    back (at its version); a write that came first wins instead."""
    first, second, third = (redis_store(own_redis_server.url, "lost:") for _ in range(3))
    try:
        await first.put(doc("a", 10), 1)
        await first.put(doc("b", 10), 2)
        assert (await first.read()).version == 2
        assert (await second.read()).version == 2
        own_redis_server.restart()  # SIGKILL: the data is gone
        restored = await first.read()
        assert (restored.version, dict(restored.documents)) == (
            2,
            {"a": doc("a", 10), "b": doc("b", 10)},
        )
        assert (await second.read()).version == 2  # already back: nothing to restore
        assert await second.put(doc("c", 1), 3) == 3  # versions go on from there
        own_redis_server.restart()
        assert await third.put(doc("d", 1), 4) == 1  # a node that never read: set lost
        assert sorted((await second.read()).documents) == ["d"]
    finally:
        for store in (first, second, third):
            await store.close()


async def test_a_write_to_a_redis_that_lost_the_set_puts_it_back_first(
    own_redis_server: ServerProcess,
) -> None:
    """FLUSHALL (or a restart without persistence), then a write before any read: the writer's
    last set comes back first and the versions go on, instead of restarting at 1 over nothing."""
    writer, other = (
        redis_store(own_redis_server.url, "lost:"),
        redis_store(own_redis_server.url, "lost:"),
    )
    try:
        for number, name in enumerate("abc", start=1):
            assert await writer.put(doc(name, 10), number) == number
        assert (await writer.read()).version == 3
        with own_redis_server.client() as admin:
            admin.flushall()

        assert await writer.put(doc("d", 10), 4) == 4
        snapshot = await other.read()
        assert snapshot.version == 4 and sorted(snapshot.documents) == ["a", "b", "c", "d"]
    finally:
        for store in (writer, other):
            await store.close()


async def test_a_user_without_rights_on_the_channel_writes_and_is_told_so(
    own_redis_server: ServerProcess,
) -> None:
    """The announcement is best effort: a user with no channels gets its write's version (not
    an error after the write committed), and a restore works the same."""
    with own_redis_server.client() as admin:
        admin.acl_setuser(
            "nochan", enabled=True, passwords=["+pw"], keys="*", commands=["+@all"],
            reset_channels=True,
        )  # fmt: skip
    store = redis_store(f"redis://nochan:pw@127.0.0.1:{own_redis_server.port}/0", "acl:")
    try:
        assert await store.put(doc("a", 10), 1) == 1
        assert await store.delete("a", 2) == 2
        assert await store.put(doc("b", 10), 3) == 3
        assert (await store.read()).version == 3
        with own_redis_server.client() as admin:
            admin.flushall()
        restored = await store.read()
        assert restored.version == 3 and sorted(restored.documents) == ["b"]
    finally:
        await store.close()

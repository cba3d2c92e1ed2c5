"""The storage contract: one table of behaviours, run against every backend.

MemoryStorage is the reference; RedisStorage must answer the same on standalone Redis (TCP and
unix socket), Cluster (3 masters), Sentinel and TLS. Redis-only checks (TTLs, key slots, round
trips, faults) follow the table.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis
from redis.crc import key_slot

from harness.net import free_ports
from ratelimit_sidecar.config.model import RateLimit, Unit
from ratelimit_sidecar.core.types import KeyId, Push, SyncBatch, SyncResult, TotalRead
from ratelimit_sidecar.storage.base import Storage
from ratelimit_sidecar.storage.errors import StoreLost, StoreTimeout, StoreUnavailable
from ratelimit_sidecar.storage.keys import KeySchema
from ratelimit_sidecar.storage.redis_store import RedisStorage
from ratelimit_sidecar.storage.redis_urls import open_redis
from simulator.memory_store import MemoryStorage
from tests.integration.conftest import ACL_PASSWORD, ACL_USER

pytestmark = pytest.mark.integration

LIMIT = RateLimit(requests_per_unit=10, unit=Unit.MINUTE, cooldown_ms=5000)  # 60 s windows
W = 29_000_000  # a window ordinal; any will do, counters are keyed by it
NASTY: list[KeyId] = [
    ("d", "k", "a:b"),
    ("d", "k:a", "b"),
    ("d:k", "a", "b"),
    ("d", "k", "{tag}"),
    ("d", "k", "}{"),
    ("d", "k", "{"),
    ("d", "k", "line\nbreak"),
    ("d", "k", "line"),
    ("d", "k", "nul\x00"),
    ("d", "k", "nul"),
    ("d", "k", "x" * 1024),
    ("d", "k", "x" * 1023),
    ("d", "k", "x" * 1024, "k2", ""),
    ("d", "k", "", "k2", "x" * 1024),
    ("d", "k", "é🙂 \t\r"),
    ("d", "k", "rls:{x}:block"),
]


class MemoryNode:
    """One node's view of a shared MemoryStorage (its `sync` has no node id of its own)."""

    def __init__(self, shared: MemoryStorage, node_id: str) -> None:
        self.shared, self.node_id = shared, node_id

    @property
    def description(self) -> str:
        return self.shared.description

    @property
    def round_trips(self) -> int:
        return self.shared.round_trips

    async def sync(self, batch: SyncBatch) -> SyncResult:
        return self.shared.execute(batch, self.node_id)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None


@dataclass
class Backend:
    name: str
    make: Callable[[str], Storage]  # node id -> a store (one per sidecar)
    admin: Any = None  # a synchronous redis-py client on the same data; None for memory
    stores: list[Storage] = field(default_factory=list)

    def store(self, node_id: str = "node-a") -> Storage:
        self.stores.append(self.make(node_id))
        return self.stores[-1]


# The 0.25 s default read timeout is meant to fail fast in production; a test machine busy with
# other suites can exceed it now and then, and these tests are about results, not latency (the
# fault tests below keep the defaults and check them).
PATIENT = "socket_timeout=3&socket_connect_timeout=3"


def backend_url(request: pytest.FixtureRequest, name: str) -> tuple[str, Any]:
    """URL of the session server for `name`, and a sync admin client on its data."""
    if name == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        return f"{cluster.url}?{PATIENT}", cluster.client()
    if name == "sentinel":
        sentinel = request.getfixturevalue("redis_sentinel")
        return f"{sentinel.url}?{PATIENT}", sentinel.master.client()
    if name == "tls":
        tls = request.getfixturevalue("redis_tls")
        return tls.url(f"ssl_ca_certs={tls.ca}&{PATIENT}"), tls.server.client()
    server = request.getfixturevalue("redis_server")
    if name == "unix":
        return f"unix://{server.workdir}/redis.sock?db=0&{PATIENT}", server.client()
    return f"{server.url}?{PATIENT}", server.client()


@contextlib.asynccontextmanager
async def open_backend(request: pytest.FixtureRequest, name: str) -> AsyncIterator[Backend]:
    if name == "memory":
        shared = MemoryStorage(node_ttl_ms=30_000)
        yield Backend(name, lambda node: MemoryNode(shared, node))
        return
    url, admin = backend_url(request, name)
    prefix = f"t{uuid.uuid4().hex[:8]}:"  # isolates tests sharing a server
    backend = Backend(name, lambda node: open_redis(url, prefix, node), admin)
    try:
        yield backend
    finally:
        for store in backend.stores:
            await store.close()
        admin.close()


REDIS_BACKENDS = ["standalone", "unix", "cluster", "sentinel", "tls"]


@pytest.fixture(params=["memory", *REDIS_BACKENDS])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    async with open_backend(request, request.param) as opened:
        yield opened


@pytest.fixture(params=REDIS_BACKENDS)
async def redis_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    async with open_backend(request, request.param) as opened:
        yield opened


def now_ms() -> int:
    return int(time.time() * 1000)


async def sync(
    store: Storage, pushes: list[Push] | None = None, totals: Sequence[tuple[KeyId, int]] = ()
) -> SyncResult:
    batch = SyncBatch(now_ms(), pushes or [], [TotalRead(k, w) for k, w in totals])
    return await store.sync(batch)


def push(key: KeyId, count: int, window: int = W, limit: RateLimit = LIMIT) -> Push:
    return Push(key, window, count, limit)


# --- the behaviour table: every backend ---------------------------------------------------------


async def test_push_returns_the_new_total(backend: Backend) -> None:
    result = await sync(backend.store(), [push(("d", "k", "v"), 3)])
    assert [(p.total, p.block_ms) for p in result.pushes] == [(3, 0)]


async def test_pushes_to_one_counter_accumulate(backend: Backend) -> None:
    store, key = backend.store(), ("d", "k", "v")
    first = await sync(store, [push(key, 3), push(key, 2)])
    second = await sync(store, [push(key, 4)])
    assert [p.total for p in first.pushes] == [3, 5]
    assert [p.total for p in second.pushes] == [9]


async def test_windows_and_keys_are_separate_counters(backend: Backend) -> None:
    store = backend.store()
    pushes = [push(("d", "k", "v"), 1), push(("d", "k", "v"), 2, W + 1), push(("d", "k", "w"), 3)]
    result = await sync(store, pushes)
    assert [p.total for p in result.pushes] == [1, 2, 3]


async def test_crossing_the_limit_sets_the_shared_flag_for_the_cooldown(backend: Backend) -> None:
    a, b = backend.store("node-a"), backend.store("node-b")
    key, other = ("d", "k", "hot"), ("d", "k", "cold")
    under = await sync(a, [push(key, 10)])
    crossed = await sync(b, [push(key, 1)])
    again = await sync(b, [push(key, 1)])
    seen = await sync(a, [push(key, 0), push(other, 0)])  # a zero push only reads
    assert under.pushes[0].block_ms == 0  # 10 is the limit itself: not over
    assert 4_500 < crossed.pushes[0].block_ms <= 5_000
    # NX: a later push over the limit reads the running cooldown, does not restart it.
    assert again.pushes[0].block_ms <= crossed.pushes[0].block_ms
    assert 4_500 < seen.pushes[0].block_ms <= crossed.pushes[0].block_ms
    assert [(p.total, p.block_ms) for p in seen.pushes][1:] == [(0, 0)]


async def test_a_zero_push_reads_an_unknown_counter_as_zero(backend: Backend) -> None:
    result = await sync(backend.store(), [push(("d", "k", "never"), 0)])
    assert [(p.total, p.block_ms) for p in result.pushes] == [(0, 0)]


async def test_total_reads_return_window_totals_or_zero(backend: Backend) -> None:
    store, key = backend.store(), ("d", "k", "v")
    await sync(store, [push(key, 7), push(key, 1, W + 1)])
    result = await sync(store, totals=[(key, W), (key, W - 1), (("d", "k", "x"), W), (key, W + 1)])
    assert result.totals == (7, 0, 0, 1)


async def test_heartbeat_counts_distinct_nodes(backend: Backend) -> None:
    a, a_again, b = backend.store("node-a"), backend.store("node-a"), backend.store("node-b")
    assert (await sync(a)).live_nodes == 1
    assert (await sync(a_again)).live_nodes == 1
    assert (await sync(b)).live_nodes == 2


async def test_a_mixed_batch_of_2500_keys_lines_up(backend: Backend) -> None:
    store = backend.store()
    keys = [("d", "user", f"u{i}") for i in range(2500)]
    counts = [i % 13 + 1 for i in range(2500)]  # over the limit (10) for i % 13 >= 10
    pushed = await sync(store, [push(k, c) for k, c in zip(keys, counts, strict=True)])
    totals = [(k, W) for k in keys[::3]]
    read = await sync(store, [push(k, 0) for k in keys[::-1]], totals=totals)
    assert [p.total for p in pushed.pushes] == counts
    assert [p.block_ms > 0 for p in pushed.pushes] == [c > 10 for c in counts]
    assert [p.total for p in read.pushes] == counts[::-1]
    assert [p.block_ms > 0 for p in read.pushes] == [c > 10 for c in counts[::-1]]
    assert list(read.totals) == counts[::3]


async def test_hostile_descriptor_values_never_collide(backend: Backend) -> None:
    store = backend.store()
    pushed = await sync(store, [push(k, i + 1) for i, k in enumerate(NASTY)])
    read = await sync(store, [push(k, 0) for k in NASTY], totals=[(k, W) for k in NASTY])
    assert [p.total for p in pushed.pushes] == list(range(1, len(NASTY) + 1))
    assert list(read.totals) == list(range(1, len(NASTY) + 1))
    over = [i for i in range(len(NASTY)) if i + 1 > LIMIT.requests_per_unit]
    assert [i for i, p in enumerate(read.pushes) if p.block_ms > 0] == over


# --- Redis only ---------------------------------------------------------------------------------


async def test_counters_expire_after_two_windows(redis_backend: Backend) -> None:
    store = redis_backend.store()
    assert isinstance(store, RedisStorage)
    key = ("d", "k", "ttl")
    await sync(store, [push(key, 11)])
    counter_ttl = redis_backend.admin.pttl(store.keys.counter(key, W))
    flag_ttl = redis_backend.admin.pttl(store.keys.flag(key))
    nodes_ttl = redis_backend.admin.pttl(store.keys.nodes())
    assert 2 * LIMIT.window_ms - 1_000 < counter_ttl <= 2 * LIMIT.window_ms
    assert 4_000 < flag_ttl <= LIMIT.cooldown
    assert 25_000 < nodes_ttl <= 30_000


async def test_the_script_is_reloaded_after_a_flush(redis_backend: Backend) -> None:
    store = redis_backend.store()
    assert isinstance(store, RedisStorage)
    key = ("d", "k", "flush")
    await sync(store, [push(key, 1)])
    redis_backend.admin.script_flush()
    before = store.round_trips
    assert (await sync(store, [push(key, 1)])).pushes[0].total == 2
    assert (await sync(store, [push(key, 1)])).pushes[0].total == 3
    assert store.round_trips - before == 3  # NOSCRIPT costs one extra trip, once


def test_every_key_of_a_key_id_shares_one_cluster_slot() -> None:
    schema = KeySchema("rls:")
    names = [schema.counter(k, W) for k in NASTY] + [schema.flag(k) for k in NASTY]
    assert len(set(names)) == len(names)
    for key in NASTY:
        same = [schema.counter(key, W), schema.counter(key, W + 1), schema.flag(key)]
        assert len({key_slot(n.encode()) for n in same}) == 1
        assert all(n.isprintable() and len(n) <= 110 and " " not in n for n in same)
    assert schema.counter(("gw", "api_key", "secret-value"), 7).endswith(":gw:api_key:7")
    assert "secret-value" not in schema.counter(("gw", "api_key", "secret-value"), 7)


def test_the_cluster_agrees_on_the_slots(redis_cluster: Any) -> None:
    schema = KeySchema("rls:")
    with redis_cluster.nodes[0].client() as node:
        for key in NASTY:
            names = (schema.counter(key, W), schema.flag(key))
            slots = {node.execute_command("CLUSTER", "KEYSLOT", n) for n in names}
            assert slots == {key_slot(schema.flag(key).encode())}


@pytest.mark.parametrize("prefix", ["a{b", "c}", "with space", "x" * 65])
def test_unsafe_prefixes_are_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        KeySchema(prefix)


def server_stats(admin: redis.Redis) -> dict[str, int]:
    """Read counters and per-command calls, from ONE command (so it adds one read itself)."""
    info = admin.info("everything")
    calls = {k: int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_")}
    return calls | {"total_reads_processed": int(info["total_reads_processed"])}


async def test_one_round_trip_per_sync_on_standalone(redis_server: Any) -> None:
    store = open_redis(f"{redis_server.url}?{PATIENT}", f"t{uuid.uuid4().hex[:8]}:", "node-a")
    keys = [("d", "k", str(i)) for i in range(5)]
    try:
        with redis_server.client() as admin:
            await sync(store, [push(k, 1) for k in keys])  # connects and caches the script
            before, trips = server_stats(admin), store.round_trips
            for _ in range(4):
                await sync(store, [push(k, 1) for k in keys], totals=[(keys[0], W)])
            after = server_stats(admin)
    finally:
        await store.close()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert store.round_trips - trips == 4
    # The server read 4 requests (plus the INFO asking): one packet of commands per sync...
    assert delta["total_reads_processed"] == 4 + 1
    # ...holding exactly the commands of the batch: one script call carries all 5 pushes, the
    # heartbeat is one EVAL of its own; no SCRIPT EXISTS/LOAD, no PING, no TIME of its own.
    assert delta["cmdstat_evalsha"] == 4 and delta["cmdstat_get"] == 4
    assert delta["cmdstat_incrby"] == 4 * 5
    assert delta["cmdstat_eval"] == delta["cmdstat_zadd"] == delta["cmdstat_zcard"] == 4
    assert delta["cmdstat_time"] == 4  # inside the heartbeat
    assert not any(delta.get(f"cmdstat_{c}") for c in ("script|exists", "script|load", "ping"))
    assert "cmdstat_pexpire" not in delta or delta["cmdstat_pexpire"] == 4  # the node set's
    # (the counters already had their TTL from the first sync: it is set when one is made)


# --- faults -------------------------------------------------------------------------------------

# Twice the 0.25 s defaults (checked below): still fails fast, with headroom on a busy machine for
# the first sync after a resume or restart.
FAST = "socket_timeout=0.5&socket_connect_timeout=0.5"


def test_defaults_fail_fast_and_never_retry() -> None:
    store = open_redis("redis://127.0.0.1:1/0", "t:", "node-a")
    assert isinstance(store.client, AsyncRedis)
    options = store.client.connection_pool.connection_kwargs
    assert (options["socket_timeout"], options["socket_connect_timeout"]) == (0.25, 0.25)
    assert options["retry"].get_retries() == 0


async def test_a_stalled_server_fails_fast_and_the_store_recovers(own_redis_server: Any) -> None:
    store = open_redis(f"{own_redis_server.url}?{FAST}", "t:", "node-a")
    key = ("d", "k", "stall")
    try:
        await sync(store, [push(key, 1)])
        own_redis_server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(StoreTimeout) as failure:
                await sync(store, [push(key, 1)])
            elapsed = time.monotonic() - started
            assert failure.value.may_have_applied
            assert isinstance(failure.value.__cause__, redis.TimeoutError)
            # What the sync loop does: its own, shorter timeout cancels the pipeline mid-read.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(sync(store, [push(key, 1)]), 0.05)
        finally:
            own_redis_server.resume()
        assert elapsed < 1.0
        # The paused pushes were delivered and ran after SIGCONT: the client cannot know that.
        total = (await sync(store, [push(key, 1)])).pushes[0].total
        assert 2 <= total <= 4
    finally:
        await store.close()


@pytest.mark.parametrize("stop", ["kill", "stop"])  # SIGKILL, or a graceful SIGTERM
async def test_a_restarted_server_is_used_again_by_the_same_store(
    own_redis_server: Any, stop: str
) -> None:
    store = open_redis(f"{own_redis_server.url}?{FAST}", "t:", "node-a")
    key = ("d", "k", "restart")
    try:
        assert (await sync(store, [push(key, 5)])).pushes[0].total == 5
        getattr(own_redis_server, stop)()
        await asyncio.sleep(0.05)  # as between two syncs: the loop takes the close in
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as failure:
            await sync(store, [push(key, 1)])
        assert time.monotonic() - started < 1.0
        assert not failure.value.may_have_applied
        assert isinstance(failure.value.__cause__, redis.ConnectionError)
        own_redis_server.start()  # same port, empty: no persistence, no cached script
        assert await store.ping()
        result = await sync(store, [push(key, 2)])
        assert (result.pushes[0].total, result.pushes[0].block_ms, result.live_nodes) == (2, 0, 1)
    finally:
        await store.close()


async def test_a_server_that_is_not_there_is_unavailable_at_once() -> None:
    (port,) = free_ports(1)  # nothing listens there: the connection is refused
    store = open_redis(f"redis://127.0.0.1:{port}/0?{FAST}", "t:", "node-a")
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as failure:
            await sync(store, [push(("d", "k", "nobody"), 1)])
        assert time.monotonic() - started < 1.0
    finally:
        await store.close()
    assert not failure.value.may_have_applied


async def test_a_connection_lost_after_sending_may_have_been_applied(
    own_redis_server: Any,
) -> None:
    store = open_redis(f"{own_redis_server.url}?{FAST}", "t:", "node-a")
    try:
        await sync(store, [push(("d", "k", "lost"), 1)])  # connected
        own_redis_server.pause()
        try:
            pending = asyncio.ensure_future(sync(store, [push(("d", "k", "lost"), 1)]))
            await asyncio.sleep(0.1)  # the pipeline is written; no answer comes
        finally:
            own_redis_server.kill()  # the socket closes under the waiting read
        with pytest.raises(StoreLost) as failure:
            await pending
    finally:
        await store.close()
    assert failure.value.may_have_applied and failure.value.kind == "connection"
    assert isinstance(failure.value.__cause__, redis.ConnectionError)


async def test_a_key_of_the_wrong_type_fails_alone(redis_backend: Backend) -> None:
    store = redis_backend.store()
    assert isinstance(store, RedisStorage)
    keys = [("d", "k", "before"), ("d", "k", "wrongtype"), ("d", "k", "after")]
    redis_backend.admin.hset(store.keys.counter(keys[1], W), "field", "not a counter")
    result = await sync(store, [push(key, 1) for key in keys], totals=[(keys[1], W)])
    again = await sync(store, [push(key, 1) for key in keys])
    assert [(p.total, p.error[:9]) for p in result.pushes] == [(1, ""), (0, "WRONGTYPE"), (1, "")]
    assert [(p.total, p.error[:9]) for p in again.pushes] == [(2, ""), (0, "WRONGTYPE"), (2, "")]
    assert result.totals == (0,)  # its read fails too: unknown
    assert result.live_nodes == 1 and result.store_time_ms > 0


async def test_a_heartbeat_key_of_the_wrong_type_leaves_only_the_node_count_unknown(
    redis_backend: Backend,
) -> None:
    store = redis_backend.store()
    assert isinstance(store, RedisStorage)
    redis_backend.admin.set(store.keys.nodes(), "not a sorted set")
    result = await sync(store, [push(("d", "k", "beat"), 3)])
    redis_backend.admin.delete(store.keys.nodes())
    after = await sync(store, [push(("d", "k", "beat"), 1)])
    assert (result.pushes[0].total, result.live_nodes) == (3, 0)
    assert (after.pushes[0].total, after.live_nodes) == (4, 1)


async def test_one_round_trip_per_node_on_cluster(redis_cluster: Any) -> None:
    store = open_redis(f"{redis_cluster.url}?{PATIENT}", f"t{uuid.uuid4().hex[:8]}:", "node-a")
    keys = [("d", "k", str(i)) for i in range(30)]  # spread over the three masters
    admins = [node.client() for node in redis_cluster.nodes]
    try:
        await sync(store, [push(k, 1) for k in keys])  # discovers slots, caches the script
        before = [server_stats(a) for a in admins]
        for _ in range(4):
            await sync(store, [push(k, 1) for k in keys], totals=[(keys[0], W)])
        after = [server_stats(a) for a in admins]
    finally:
        await store.close()
        for admin in admins:
            admin.close()
    reads = [
        a["total_reads_processed"] - b["total_reads_processed"]
        for a, b in zip(after, before, strict=True)
    ]
    evalsha = [
        a["cmdstat_evalsha"] - b["cmdstat_evalsha"] for a, b in zip(after, before, strict=True)
    ]
    assert reads == [4 + 1] * 3  # each master: one read per sync, plus the INFO asking
    assert sum(evalsha) == 4 * 30 and all(evalsha)


# --- open_redis: URL forms, credentials, TLS -----------------------------------------------------


def auth_url(server: Any, password: str = ACL_PASSWORD) -> str:
    return f"redis://{ACL_USER}:{quote(password, safe='')}@127.0.0.1:{server.port}/0?{PATIENT}"


async def test_user_and_password_from_the_url(redis_server: Any) -> None:
    good = open_redis(auth_url(redis_server), "t:", "node-a")
    bad = open_redis(auth_url(redis_server, "wrong-secret"), "t:", "node-a")
    try:
        assert (await sync(good, [push(("d", "k", "auth"), 1)])).pushes[0].total >= 1
        with pytest.raises(StoreUnavailable) as failure:
            await sync(bad)
    finally:
        await good.close()
        await bad.close()
    assert isinstance(failure.value.__cause__, redis.AuthenticationError)
    assert "wrong-secret" not in str(failure.value)
    assert good.description == f"redis://127.0.0.1:{redis_server.port}/0"


async def test_tls_verifies_the_server_unless_told_not_to(redis_tls: Any) -> None:
    unchecked = open_redis(redis_tls.url(f"ssl_cert_reqs=none&{PATIENT}"), "t:", "node-a")
    strict = open_redis(redis_tls.url(PATIENT), "t:", "node-a")  # system CAs only: must refuse
    try:
        assert (await sync(unchecked)).live_nodes >= 1
        with pytest.raises(StoreUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            await sync(strict)
    finally:
        await unchecked.close()
        await strict.close()
    assert unchecked.description == f"rediss://127.0.0.1:{redis_tls.port}/0"


async def test_descriptions_name_the_topology_without_secrets(
    redis_cluster: Any, redis_sentinel: Any
) -> None:
    cluster_url = redis_cluster.url.replace("://", "://u:pw-secret@")
    sentinel_url = redis_sentinel.url.replace("://", "://u:pw-secret@")
    stores = [open_redis(cluster_url, "t:", "n"), open_redis(sentinel_url + "?db=0", "t:", "n")]
    try:
        descriptions = [s.description for s in stores]
    finally:
        for store in stores:
            await store.close()
    assert descriptions[0] == redis_cluster.url.replace("redis+cluster", "redis-cluster")
    assert descriptions[1] == redis_sentinel.url.replace("redis+sentinel", "redis-sentinel")
    assert not any("secret" in d for d in descriptions)


@pytest.mark.parametrize(
    "url",
    [
        "http://u:pw-secret@127.0.0.1:6379/0",
        "127.0.0.1:6379",
        "redis://u:pw-secret@127.0.0.1:notaport/0",
        "redis://u:pw-secret@127.0.0.1:6379/0?socket_timeout=soon",
        "redis://u:pw-secret@127.0.0.1:6379/0?no_such_option=1",
        "rediss://u:pw-secret@127.0.0.1:6379/0?ssl_cert_reqs=sometimes",
        "redis+cluster://u:pw-secret@/",
        "redis+cluster://u:pw-secret@127.0.0.1:6379/2",
        "redis+cluster://u:pw-secret@127.0.0.1:99999",
        "redis+sentinel://u:pw-secret@127.0.0.1:26379",
        "redis+sentinel://u:pw-secret@127.0.0.1:26379/mymaster/zero",
        "redis+sentinel://127.0.0.1:26379/mymaster?sentinel_password=pw-secret&bogus=1",
    ],
)
def test_unusable_urls_are_refused_without_the_password(url: str) -> None:
    with pytest.raises(ValueError, match="redis URL") as failure:
        open_redis(url, "t:", "n")
    assert "pw-secret" not in str(failure.value)

"""An error in the middle of a sync never inflates Redis's counts nor fails the whole node.

Each test drives one node (FleetLimiter + SyncLoop + RedisStorage) on a virtual clock, so every
admitted hit is counted exactly, injects one fault into real Redis while it syncs, removes it,
and then compares Redis's totals with what the node admitted. Clients stay well under their
limit, so any OVER_LIMIT answer is a fault leaking into decisions.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from harness.redis_servers import Cluster, ServerGroup, ServerProcess
from ratelimit_sidecar.config.model import Unit
from ratelimit_sidecar.core import Code, FleetLimiter, Hit, KeyId
from ratelimit_sidecar.storage.redis_store import RedisStorage
from ratelimit_sidecar.storage.redis_urls import open_redis
from ratelimit_sidecar.sync.span_sync import SyncLoop
from tests.unit.core.rules import rule

pytestmark = pytest.mark.integration

PATIENT = "socket_timeout=3&socket_connect_timeout=3"
WINDOW_MS, SPANS, MAX = 10_000, 4, 100
SPAN_MS = WINDOW_MS // SPANS
RULE = rule(rpu=MAX, unit=Unit.SECOND, multiplier=WINDOW_MS // 1000, spans=SPANS)
HITS_PER_SPAN = 10  # per client: 40 a window, 40 % of MAX
WAIT_S = 10.0  # bound of every wait on Redis state
OOM_HEADROOM = 200_000  # bytes over the memory in use: room for about one script call's keys
Fault = Callable[[], None]


@dataclass
class Node:
    """One sidecar's core, sync loop and store, on a clock the test moves by hand."""

    store: RedisStorage
    clients: list[KeyId]
    now: int = 0
    hits_per_span: int = HITS_PER_SPAN
    admitted: Counter[tuple[KeyId, int]] = field(default_factory=Counter)
    refused: Counter[KeyId] = field(default_factory=Counter)
    store_up: list[bool] = field(default_factory=list)
    key_errors: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Every key synced, however quiet (core/quiet_keys.py): these tests count pushes.
        self.limiter = FleetLimiter(quiet_share=0.0)
        # The loop's own deadline is real time (at most half a span): far above a sync here.
        self.loop = SyncLoop(self.limiter, self.store, lambda: self.now, timeout_ms=1_000)

    async def run_spans(self, spans: int, faults: dict[int, Fault] | None = None) -> None:
        """`spans` spans of traffic, each ended by a sync; `faults[i]` runs before span i's sync."""
        for index in range(spans):
            start = self.now
            for i in range(self.hits_per_span):
                self.now = start + i * (SPAN_MS // self.hits_per_span)
                for key in self.clients:
                    self.hit(key)
            self.now = start + SPAN_MS
            if faults and index in faults:
                faults[index]()
            await self.loop.sync_once()
            self.store_up.append(self.loop.store_up)
            self.key_errors.append(self.loop.key_errors)

    def hit(self, key: KeyId) -> None:
        decision = self.limiter.hit(self.now, [Hit(RULE, key, 1)])
        if decision.code is Code.OK:
            self.admitted[key, self.now // WINDOW_MS] += 1
        else:
            self.refused[key] += 1

    async def finish(self) -> None:
        """Push everything still unconfirmed (what a shutdown does)."""
        assert await self.loop.flush() == 0

    def windows(self) -> list[int]:
        return sorted({window for _, window in self.admitted})

    def totals(self, admin: Any) -> dict[tuple[KeyId, int], int]:
        """Redis's count for every (client, window) the node admitted hits in."""
        counted = {}
        for key, window in self.admitted:
            value = admin.get(self.store.keys.counter(key, window))
            counted[key, window] = int(value or 0)
        return counted


def clients(count: int = 20) -> list[KeyId]:
    return [("d", "k", f"client{i}") for i in range(count)]


def first_window() -> int:
    """The start of the next window on the wall clock (counters' TTLs are real time)."""
    return (time.time_ns() // 1_000_000 // WINDOW_MS + 1) * WINDOW_MS


def open_store(url: str) -> RedisStorage:
    store = open_redis(f"{url}?{PATIENT}", f"t{uuid.uuid4().hex[:8]}:", "node-a")
    assert isinstance(store, RedisStorage)
    return store


@pytest.fixture
async def node(own_redis_server: ServerProcess) -> AsyncIterator[Node]:
    store = open_store(own_redis_server.url)
    yield Node(store, clients(), first_window())
    await store.close()


def admin_of(server: ServerProcess) -> redis.Redis:
    return server.client()


def assert_exact(node: Node, admin: Any) -> None:
    totals = node.totals(admin)
    assert totals == dict(node.admitted), diff(totals, node.admitted)


def diff(totals: dict[tuple[KeyId, int], int], admitted: Counter[tuple[KeyId, int]]) -> str:
    wrong = {k: (totals.get(k), v) for k, v in admitted.items() if totals.get(k) != v}
    return f"(redis, admitted) differ for {len(wrong)} counters, e.g. {list(wrong.items())[:3]}"


def report(name: str, node: Node, admin: Any) -> None:
    """One line of measured numbers, shown with `pytest -s`."""
    totals = sum(node.totals(admin).values())
    admitted = sum(node.admitted.values())
    print(f"\n{name}: redis {totals} / admitted {admitted}; key errors per sync {node.key_errors}")


# --- a wrong-typed counter, a wrong-typed heartbeat key -------------------------------------------


async def test_a_wrong_typed_counter_fails_only_its_key(
    node: Node, own_redis_server: ServerProcess
) -> None:
    bad = node.clients[10]  # in the middle of the script call: keys before it must not re-count
    with admin_of(own_redis_server) as admin:
        await node.run_spans(2)
        # The next window's counter of one client holds a hash before the client counts in it.
        bad_counter = node.store.keys.counter(bad, node.now // WINDOW_MS + 1)
        admin.hset(bad_counter, "field", "not a counter")
        await node.run_spans(4)  # the rest of this window, half of the next
        admin.delete(bad_counter)
        await node.run_spans(4)
        await node.finish()
        report("wrong-typed counter", node, admin)
        assert_exact(node, admin)
    # Only that key failed, in every sync of its window while the fault lasted.
    assert node.key_errors == [0, 0, 0, 0, 1, 1, 0, 0, 0, 0]
    assert all(node.store_up)
    assert not node.refused


async def test_a_wrong_typed_heartbeat_key_costs_only_the_live_node_count(
    node: Node, own_redis_server: ServerProcess
) -> None:
    nodes_key = node.store.keys.nodes()
    with admin_of(own_redis_server) as admin:
        await node.run_spans(2)
        admin.set(nodes_key, "not a sorted set")  # SET replaces a key of any type
        await node.run_spans(4)
        admin.delete(nodes_key)
        await node.run_spans(3)
        await node.finish()
        report("wrong-typed rls:nodes", node, admin)
        assert_exact(node, admin)
        assert admin.zcard(nodes_key) == 1  # the heartbeat is back
    # One heartbeat per span: the four while the key was wrong failed, counted; then no more.
    assert node.loop.heartbeat_errors == 4 and node.loop.heartbeat_error == ""
    assert all(node.store_up) and not any(node.key_errors)
    assert not node.refused


# --- out of memory partway through a sync -----------------------------------------------------


async def test_running_out_of_memory_partway_never_counts_twice(
    own_redis_server: ServerProcess,
) -> None:
    # 2,500 clients: three script calls per sync, so memory can run out between them.
    node = Node(open_store(own_redis_server.url), clients(2_500), first_window(), hits_per_span=2)
    with admin_of(own_redis_server) as admin:
        try:
            await node.run_spans(4)  # one window: the next sync creates 2,500 new counters

            def fill_up() -> None:
                used = int(admin.info("memory")["used_memory"])
                admin.config_set("maxmemory-policy", "noeviction")
                admin.config_set("maxmemory", used + OOM_HEADROOM)

            await node.run_spans(2, {0: fill_up})
            admin.config_set("maxmemory", 0)
            await node.run_spans(2)
            await node.finish()
            report("out of memory partway", node, admin)
            assert_exact(node, admin)
        finally:
            await node.store.close()
    assert 0 < node.key_errors[4] <= 2_500 and not any(node.key_errors[6:])
    assert all(node.store_up)
    assert not node.refused


# --- a read-only replica (a failover under the node's feet) ------------------------------------


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def replication(admin: Any) -> dict[str, Any]:
    return dict(admin.info("replication"))


def replica_of(admin: Any, master: ServerProcess) -> None:
    """Make `admin`'s server a replica of `master` and wait until it has master's data."""
    admin.replicaof("127.0.0.1", master.port)
    wait_for(lambda: replication(admin).get("master_link_status") == "up", "the replica link")


@pytest.fixture
def other_server(server_group: ServerGroup) -> Iterator[ServerProcess]:
    server = server_group.standalone()
    try:
        yield server
    finally:
        server.stop()


async def test_a_server_turned_read_only_fails_its_keys_and_they_are_resent(
    node: Node, own_redis_server: ServerProcess, other_server: ServerProcess
) -> None:
    with admin_of(own_redis_server) as admin, admin_of(other_server) as other:

        def demote() -> None:
            """What a failover does to the old primary, without losing its data: a copy takes
            over as primary, and the old one follows it (and so refuses writes)."""
            replica_of(other, own_redis_server)
            other.replicaof("NO", "ONE")
            replica_of(admin, other_server)

        # Within one window: a key keeps unsent counts of one window only, so an outage across
        # a window's end drops (and counts in dropped_hits) the older window's, as it did before.
        await node.run_spans(1)
        await node.run_spans(2, {0: demote})
        admin.replicaof("NO", "ONE")
        await node.run_spans(5)
        await node.finish()
        report("read-only replica", node, admin)
        assert_exact(node, admin)
    assert node.key_errors == [0, 20, 20, 0, 0, 0, 0, 0]
    assert all(node.store_up)
    assert not node.refused


# --- a Cluster slot moved to another primary (MOVED) -------------------------------------------


def node_id(admin: Any) -> str:
    return str(admin.execute_command("CLUSTER", "MYID").decode())


def owner(cluster: Cluster, slot: int, asked: int = 0) -> int:
    """The index in `cluster.nodes` of the primary serving `slot`, as node `asked` sees it."""
    with cluster.nodes[asked].client() as admin:
        for start, end, primary, *_ in admin.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                port = primary[1]
                return next(i for i, n in enumerate(cluster.nodes) if n.port == port)
    raise AssertionError(f"slot {slot} is not served")


def move_slot(cluster: Cluster, slot: int, target: int) -> None:
    """Migrate `slot` with its keys to `cluster.nodes[target]`, the way resharding does."""
    source = owner(cluster, slot)
    src, dst = cluster.nodes[source], cluster.nodes[target]
    with src.client() as a, dst.client() as b:
        src_id, dst_id = node_id(a), node_id(b)
        b.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        a.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        while keys := a.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            a.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys)
        for server in cluster.nodes:
            with server.client() as c:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    nodes = range(len(cluster.nodes))
    agreed = lambda: all(owner(cluster, slot, i) == target for i in nodes)  # noqa: E731
    wait_for(agreed, "every node to see the slot's new owner")


def moved_replies(cluster: Cluster) -> int:
    total = 0
    for server in cluster.nodes:
        with server.client() as admin:
            stats = admin.info("errorstats")
            total += int(stats.get("errorstat_MOVED", {}).get("count", 0))
    return total


async def test_a_slot_moved_to_another_primary_keeps_the_counts_exact(
    redis_cluster: Cluster,
) -> None:
    node = Node(open_store(redis_cluster.url), clients(), first_window())
    slot = key_slot(node.store.keys.tag(node.clients[10]).encode())
    home = owner(redis_cluster, slot)
    away = (home + 1) % len(redis_cluster.nodes)
    before = moved_replies(redis_cluster)
    try:
        with redis_cluster.client() as admin:
            await node.run_spans(1)
            await node.run_spans(2, {0: lambda: move_slot(redis_cluster, slot, away)})
            await node.run_spans(1, {0: lambda: move_slot(redis_cluster, slot, home)})
            await node.run_spans(4)
            await node.finish()
            report("cluster slot moved", node, admin)
            assert_exact(node, admin)
    finally:
        await node.store.close()
        if owner(redis_cluster, slot) != home:
            move_slot(redis_cluster, slot, home)
    assert moved_replies(redis_cluster) > before  # the node really was sent elsewhere
    assert all(node.store_up) and not any(node.key_errors)
    assert not node.refused

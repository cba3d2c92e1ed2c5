"""Following the shared override set: which messages cause reads, how bursts coalesce, the lag."""

from __future__ import annotations

import asyncio

from ratelimit_sidecar.overrides.follower import OverrideFollower, follow_overrides
from ratelimit_sidecar.overrides.store import OverrideSnapshot
from ratelimit_sidecar.storage.keys import KeySchema
from ratelimit_sidecar.storage.redis_urls import open_redis
from ratelimit_sidecar.storage.subscriber import Subscriber


class FakeKeeper:
    """A keeper whose full read takes the store's version, when `gate` lets it finish."""

    def __init__(self) -> None:
        self.snapshot = OverrideSnapshot(0, {})
        self.store_version = 0
        self.reads = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail = False
        self.lags: list[float] = []

    @property
    def version(self) -> int:
        return self.snapshot.version

    async def refresh(self) -> bool:
        self.reads += 1
        await self.gate.wait()
        if self.fail:
            return False
        self.snapshot = OverrideSnapshot(self.store_version, {})
        return True

    def observe_propagation(self, seconds: float) -> None:
        self.lags.append(seconds)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def follower(keeper: FakeKeeper, now_ms: int = 10_000) -> tuple[OverrideFollower, list[float]]:
    return OverrideFollower(keeper, lambda: now_ms), keeper.lags


async def test_a_newer_version_is_read_and_its_lag_observed() -> None:
    keeper = FakeKeeper()
    follow, lags = follower(keeper)
    keeper.store_version = 3
    follow.on_message(b"3|9750")
    await settle()
    assert (keeper.reads, keeper.version, lags) == (1, 3, [0.25])
    follow.on_message(b"2|9800")  # older, and the read at 10,000 had it: no read
    await settle()
    assert (keeper.reads, lags) == (1, [0.25, 0.2])
    keeper.store_version = 1
    follow.on_message(b"1|10100")  # older yet written after that read: Redis began again
    await settle()
    assert (keeper.reads, keeper.version) == (2, 1)


async def test_a_burst_of_messages_costs_two_reads() -> None:
    keeper = FakeKeeper()
    follow, lags = follower(keeper)
    keeper.gate.clear()
    for version in range(1, 101):
        keeper.store_version = version
        follow.on_message(f"{version}|{9000 + version}".encode())
        await asyncio.sleep(0)
    keeper.gate.set()
    await settle()
    assert keeper.reads == 2
    assert keeper.version == 100
    assert len(lags) == 100 and max(lags) == 0.999


async def test_bad_messages_and_restores_are_not_lags() -> None:
    keeper = FakeKeeper()
    follow, lags = follower(keeper)
    follow.on_message(b"garbage")
    follow.on_message(b"\xff\xfe")
    await settle()
    assert (keeper.reads, follow.malformed) == (0, 2)
    keeper.store_version = 5
    follow.on_message(b"5|0")  # a restore: no write time
    await settle()
    assert (keeper.reads, keeper.version, lags) == (1, 5, [])


async def test_a_failed_read_keeps_the_set_and_the_next_trigger_reads_again() -> None:
    keeper = FakeKeeper()
    follow, lags = follower(keeper)
    keeper.store_version, keeper.fail = 2, True
    follow.on_message(b"2|9000")
    await settle()
    assert (keeper.reads, keeper.version, lags) == (1, 0, [])
    keeper.fail = False
    follow.request()  # the reconnection or the periodic read
    await settle()
    assert (keeper.reads, keeper.version, lags) == (2, 2, [1.0])


async def test_reconnection_reads_and_keeps_the_other_hook() -> None:
    keeper = FakeKeeper()
    follow, _ = follower(keeper)
    subscriber = Subscriber(object())  # type: ignore[arg-type]  # never run here
    others: list[int] = []
    subscriber.on_connect = lambda: others.append(1)
    follow.attach(subscriber, KeySchema("p:"))
    assert subscriber.on_connect is not None
    subscriber.on_connect()
    await settle()
    assert (others, keeper.reads) == ([1], 1)
    assert "p:events:overrides" in subscriber._handlers


def test_only_a_redis_store_is_followed() -> None:
    keeper = FakeKeeper()
    assert follow_overrides(None, keeper, lambda: 0) == (None, None)
    storage = open_redis("redis://127.0.0.1:1/0", "p:")  # connects lazily: never here
    subscriber, follow = follow_overrides(storage, keeper, lambda: 0)
    assert subscriber is not None and follow is not None
    shared = Subscriber(storage.client)
    assert follow_overrides(storage, keeper, lambda: 0, shared)[0] is shared


async def test_a_message_that_comes_after_its_read_counts_until_that_read() -> None:
    keeper = FakeKeeper()
    now = [10_000]
    follow = OverrideFollower(keeper, lambda: now[0])
    keeper.store_version = 5  # versions 4 and 5 written; the message of 5 comes first
    follow.on_message(b"5|9900")
    await settle()
    now[0] = 10_400
    follow.on_message(b"4|9800")  # read at 10,000 had it: 200 ms, not 600
    await settle()
    assert (keeper.reads, keeper.lags) == (1, [0.1, 0.2])

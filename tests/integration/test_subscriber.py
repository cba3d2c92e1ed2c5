"""The node's pub/sub connection on real Redis: delivery, repair hooks, reconnection."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from harness.redis_servers import Cluster, ServerProcess
from ratelimit_sidecar.storage.redis_urls import open_redis
from ratelimit_sidecar.storage.subscriber import Subscriber

WAIT_S = 5.0


async def eventually(check: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Poll `check` (every 10 ms, at most `timeout_s`); fail the test if it never holds."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def with_subscriber(
    url: str, channel: str, body: Callable[[Subscriber, list[bytes], list[int]], Awaitable[None]]
) -> None:
    """Run `body` beside a running subscriber of `channel` (messages and connects recorded)."""
    storage = open_redis(url)
    subscriber = Subscriber(storage.client, retry_s=0.05, quiet_s=0.5)
    received: list[bytes] = []
    connects: list[int] = []
    subscriber.on(channel, received.append)
    subscriber.on_connect = lambda: connects.append(len(received))
    task = asyncio.create_task(subscriber.run())
    try:
        await eventually(lambda: subscriber.connected)
        await body(subscriber, received, connects)
    finally:
        subscriber.stop()
        await asyncio.wait_for(task, WAIT_S)
        await storage.close()
    assert not subscriber.connected


def test_messages_reach_the_handler_and_others_are_ignored(redis_server: ServerProcess) -> None:
    async def body(_s: Subscriber, received: list[bytes], connects: list[int]) -> None:
        with redis_server.client() as publisher:
            publisher.publish("sub-test:other", b"not mine")
            publisher.publish("sub-test:blocks", b"k1|100")
            publisher.publish("sub-test:blocks", b"k2|200")
        await eventually(lambda: len(received) == 2)
        assert received == [b"k1|100", b"k2|200"]
        assert connects == [0]  # `on_connect` ran once, before any message

    asyncio.run(with_subscriber(redis_server.url, "sub-test:blocks", body))


def test_a_killed_connection_comes_back_and_repairs(redis_server: ServerProcess) -> None:
    async def body(subscriber: Subscriber, received: list[bytes], connects: list[int]) -> None:
        with redis_server.client() as admin:
            assert admin.client_kill_filter(_type="pubsub") >= 1
            await eventually(lambda: subscriber.connections == 2)
            assert len(connects) == 2  # the repair hook ran again on the new connection
            admin.publish("sub-test:again", b"after")
        await eventually(lambda: received == [b"after"])

    asyncio.run(with_subscriber(redis_server.url, "sub-test:again", body))


def test_a_server_restart_is_survived(own_redis_server: ServerProcess) -> None:
    async def body(subscriber: Subscriber, received: list[bytes], _c: list[int]) -> None:
        own_redis_server.kill()
        await eventually(lambda: not subscriber.connected)
        own_redis_server.restart()
        await eventually(lambda: subscriber.connected)
        with own_redis_server.client() as publisher:
            publisher.publish("sub-test:restart", b"back")
        await eventually(lambda: received == [b"back"])

    asyncio.run(with_subscriber(own_redis_server.url, "sub-test:restart", body))


def test_a_frozen_server_is_noticed_by_the_ping(own_redis_server: ServerProcess) -> None:
    async def body(subscriber: Subscriber, _r: list[bytes], _c: list[int]) -> None:
        own_redis_server.pause()
        try:
            await eventually(lambda: not subscriber.connected)
        finally:
            own_redis_server.resume()
        await eventually(lambda: subscriber.connected)

    asyncio.run(with_subscriber(own_redis_server.url, "sub-test:frozen", body))


def test_cluster_messages_published_on_any_node_arrive(redis_cluster: Cluster) -> None:
    async def body(_s: Subscriber, received: list[bytes], _c: list[int]) -> None:
        for node in redis_cluster.nodes:  # PUBLISH on every master: each must reach us
            with node.client() as publisher:
                publisher.publish("sub-test:cluster", node.url.encode())
        await eventually(lambda: len(received) == len(redis_cluster.nodes))

    asyncio.run(with_subscriber(redis_cluster.url, "sub-test:cluster", body))

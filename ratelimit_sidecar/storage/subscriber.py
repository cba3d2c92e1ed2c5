"""One Redis pub/sub connection per node: messages the fleet must see at once.

Pub/sub is the fast path only: a message reaches only the subscribers connected when it is
published, so whoever relies on one also reads the state it announces in full, periodically and
on every (re)connect (`on_connect`). The connection is watched (a PING when quiet) and made again
with a growing pause; handlers run on the event loop and must not block.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.client import PubSub
from redis.exceptions import RedisClusterException, RedisError

log = logging.getLogger("ratelimit_sidecar.subscriber")

RETRY_S = 0.5  # first pause after a failure; doubles up to MAX_RETRY_S
MAX_RETRY_S = 5.0
QUIET_S = 5.0  # a PING after this long without a message; no answer in as long again: reconnect
READ_S = 0.5  # longest single wait for a message, so `stop` is seen promptly
YIELD_EVERY = 32  # messages handled back to back before yielding to the event loop
Handler = Callable[[bytes], None]


class SubscriptionLost(RedisError):
    """The connection stayed silent after a PING."""


class Subscriber:
    """`on(channel, handler)` before `run()`; `on_connect` runs before a connection's messages."""

    def __init__(
        self, client: Redis | RedisCluster, *, retry_s: float = RETRY_S, quiet_s: float = QUIET_S
    ) -> None:
        self._client = client
        self._handlers: dict[str, Handler] = {}
        self._retry_s = retry_s
        self._pause = retry_s
        self._quiet_s = quiet_s
        self._stop = asyncio.Event()
        self.on_connect: Callable[[], None] | None = None
        self.on_state: Callable[[bool], None] | None = None  # called when `connected` changes
        self.connected = False
        self.connections = 0  # successful subscriptions so far (reconnects = this - 1)

    def on(self, channel: str, handler: Handler) -> None:
        self._handlers[channel] = handler

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        while not self._stop.is_set() and self._handlers:
            try:
                await self._listen()
            except (RedisError, RedisClusterException, OSError) as exc:
                if self.connected:
                    log.warning("subscription lost (%s); reconnecting", type(exc).__name__)
                elif self._pause == self._retry_s:  # once per streak (say, an ACL without it)
                    log.warning("cannot subscribe (%s: %s); retrying", type(exc).__name__, exc)
            except Exception:  # a client bug must not end the subscription for good
                log.exception("subscription failed; reconnecting")
            if not self._stop.is_set():
                self._set_connected(False)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self._pause)
                self._pause = min(self._pause * 2, MAX_RETRY_S)
        self._set_connected(False)

    async def _listen(self) -> None:
        if isinstance(self._client, RedisCluster):
            await self._client.initialize()  # the slot map, which the pub/sub node comes from
        pubsub = self._client.pubsub()
        try:
            await pubsub.subscribe(*self._handlers)
            await self._confirmed(pubsub)
            self.connections += 1
            self._pause = self._retry_s
            if self.connections > 1:
                log.info("subscription is back")
            self._set_connected(True)
            if self.on_connect is not None:
                self.on_connect()
            await self._deliver(pubsub)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]

    async def _confirmed(self, pubsub: PubSub) -> None:
        """Only once every channel is confirmed can nothing published be missed."""
        pending = set(self._handlers)
        deadline = asyncio.get_running_loop().time() + self._quiet_s
        while pending:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise SubscriptionLost("no subscribe confirmation")
            message = await pubsub.get_message(timeout=min(left, READ_S))
            if message is not None and message["type"] == "subscribe":
                pending.discard(_text(message["channel"]))

    async def _deliver(self, pubsub: PubSub) -> None:
        loop = asyncio.get_running_loop()
        heard = loop.time()
        pinged = False
        handled = 0
        while not self._stop.is_set():
            message = await pubsub.get_message(timeout=READ_S)
            now = loop.time()
            if message is not None:
                heard, pinged = now, False
                self._handle(message)
                handled += 1
                if handled % YIELD_EVERY == 0:  # a burst is read from the buffer without a
                    await asyncio.sleep(0)  # pause: let requests in between
            elif now - heard > self._quiet_s * (2 if pinged else 1):
                if pinged:
                    raise SubscriptionLost("no answer to PING")
                await pubsub.ping()
                pinged = True

    def _handle(self, message: dict[str, object]) -> None:
        if message["type"] != "message":
            return
        handler = self._handlers.get(_text(message["channel"]))
        data = message["data"]
        if handler is None or not isinstance(data, bytes):
            return
        try:
            handler(data)
        except Exception:  # one bad message must not end the subscription
            log.exception("handler of %s failed", _text(message["channel"]))

    def _set_connected(self, connected: bool) -> None:
        if connected != self.connected:
            self.connected = connected
            if self.on_state is not None:
                self.on_state(connected)


def _text(channel: object) -> str:
    return channel.decode() if isinstance(channel, bytes) else str(channel)

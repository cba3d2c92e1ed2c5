"""The shared store on Redis (standalone, Sentinel or Cluster): one pipeline per span end.

`RedisStorage.sync` sends the commands `codec.py` packs for a `SyncBatch` as one
non-transactional pipeline and has the codec read the replies back. On Cluster, redis-py splits
the pipeline by node and sends the parts concurrently: one round trip per Redis node. Semantics
are those of `MemoryStorage`; key names are in `keys.py`; `redis_urls.py` opens the clients.

Nothing here retries: a retried INCRBY could count a span twice, and a stalled sync is worse
than a failed one because the caller times it out and falls back to local thresholds. Sockets
therefore get short timeouts unless the URL says otherwise (`redis_urls.client_defaults`).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from importlib import resources
from typing import Any, TypeVar

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from ratelimit_sidecar.core.types import SyncBatch, SyncResult
from ratelimit_sidecar.storage.codec import Command, Encoded, SyncCodec
from ratelimit_sidecar.storage.errors import (
    StoreError,
    StoreRefused,
    StoreTimeout,
    StoreUnavailable,
)
from ratelimit_sidecar.storage.keys import DEFAULT_PREFIX, KeySchema

SYNC_SCRIPT = resources.files(__package__).joinpath("sync.lua").read_text(encoding="utf-8")
SYNC_SHA = hashlib.sha1(SYNC_SCRIPT.encode("utf-8")).hexdigest()
THREAD_ABOVE = 2000  # pushes in a batch above which packing and parsing leave the loop
DEFAULT_NODE_TTL_MS = 30_000
T = TypeVar("T")


class RedisStorage:
    """A `Storage` over a redis-py asyncio client (`Redis` or `RedisCluster`)."""

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        description: str,
        prefix: str = DEFAULT_PREFIX,
        node_id: str = "",
        node_ttl_ms: int = DEFAULT_NODE_TTL_MS,
        on_close: Sequence[Callable[[], Awaitable[None]]] = (),
    ) -> None:
        self.client = client
        self.keys = KeySchema(prefix)
        self.node_id = node_id
        self.node_ttl_ms = node_ttl_ms
        self.codec = SyncCodec(
            self.keys,
            cluster=isinstance(client, RedisCluster),
            node_id=node_id,
            node_ttl_ms=node_ttl_ms,
        )
        self.round_trips = 0  # pipelines sent; on Cluster each fans out to the nodes in parallel
        self._description = description
        self._on_close = tuple(on_close)

    @property
    def description(self) -> str:
        return self._description

    async def sync(self, batch: SyncBatch) -> SyncResult:
        """Apply `batch`; raises only `StoreError`s (see `storage/errors.py`)."""
        # Packing and parsing a large batch is pure string work: done in a worker thread, so
        # the event loop keeps answering requests meanwhile (the GIL switches every 5 ms).
        big = len(batch.pushes) > THREAD_ABOVE
        encoded = await _maybe_thread(big, self.codec.encode, batch)
        replies = await self._send(encoded)
        for reply in replies:
            if isinstance(reply, BaseException):
                raise store_error(reply) from reply
        return await _maybe_thread(big, self.codec.decode, encoded.layout, replies)

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def close(self) -> None:
        await self.client.aclose()
        for closer in self._on_close:
            await closer()

    async def _send(self, encoded: Encoded) -> list[Any]:
        """The pipeline's replies, error replies in place; a failure resets the Cluster map."""
        scripts = [("EVALSHA", SYNC_SHA, *args) for args in encoded.script_args]
        try:
            replies = await self._run([*scripts, *encoded.commands])
            await self._reload_script(encoded.script_args, replies)
        except Exception as exc:
            await self._forget_topology()
            raise store_error(exc) from exc
        return replies

    async def _run(self, commands: list[Command]) -> list[Any]:
        """One pipeline; error replies come back in place so NOSCRIPT can be repaired."""
        if not commands:
            return []
        self.round_trips += 1
        async with self.client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute(raise_on_error=False))

    async def _reload_script(self, calls: Sequence[Command], replies: list[Any]) -> None:
        """Re-run with EVAL the script calls a server rejected for not knowing the script.

        That happens once after a server restart or SCRIPT FLUSH. A NOSCRIPT reply means the
        script did not run, so re-sending it cannot count twice. EVAL also caches the script,
        so the following syncs are single round trips again (a server that evicts old EVAL
        scripts just makes this happen again). redis-py's own `Script` objects would instead
        send SCRIPT EXISTS before every pipeline: two round trips per sync.
        """
        missing = [i for i in range(len(calls)) if _noscript(replies[i])]
        if not missing:
            return
        retry = [("EVAL", SYNC_SCRIPT, *calls[i]) for i in missing]
        for i, reply in zip(missing, await self._run(retry), strict=True):
            replies[i] = reply

    async def _forget_topology(self) -> None:
        """After a failure on Cluster, rediscover the slot map on the next sync (failover)."""
        if isinstance(self.client, RedisCluster):
            await self.client.aclose()


def store_error(exc: BaseException) -> StoreError:
    """The typed failure for an exception raised or replied by redis-py or its socket.

    A connection closed after the pipeline was written counts as unavailable, not as maybe
    applied: only timeouts are treated as maybe delivered.
    """
    if isinstance(exc, StoreError):
        return exc
    kind: type[StoreError] = StoreRefused  # error replies, unparsable answers, anything else
    if isinstance(exc, RedisTimeoutError | TimeoutError):
        kind = StoreTimeout
    elif isinstance(exc, RedisConnectionError | RedisClusterException | OSError):
        kind = StoreUnavailable
    return kind(f"{type(exc).__name__}: {exc}")


async def _maybe_thread(big: bool, func: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(func, *args) if big else func(*args)


def _noscript(reply: Any) -> bool:
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, Exception) and str(reply).startswith("NOSCRIPT")
    )

"""The shared store on Redis (standalone, Sentinel or Cluster): one pipeline per span end.

`sync` sends what `codec.py` packs as one non-transactional pipeline (on Cluster one part per
node, concurrently). Semantics are the reference store's (simulator/memory_store.py).

Nothing here retries (a retried INCRBY could count a span twice) and sockets time out soon: a
stalled sync is worse than a failed one, which falls back to local thresholds.

A sync fails as a whole only with its connection, saying whether anything may have run:
connections are made before writing, so a failure to connect applied nothing (resent), while a
timeout or a broken connection after writing may have applied it all (never resent).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

from redis.asyncio import ConnectionPool, Redis, RedisCluster
from redis.asyncio.client import Pipeline
from redis.exceptions import BusyLoadingError, RedisClusterException, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ratelimit_sidecar.config.model import AlgorithmName
from ratelimit_sidecar.core.types import SyncBatch, SyncResult
from ratelimit_sidecar.storage import scripts
from ratelimit_sidecar.storage.codec import SCRIPT_FILES, Command, Encoded, SyncCodec
from ratelimit_sidecar.storage.errors import (
    StoreError,
    StoreLost,
    StoreRefused,
    StoreTimeout,
    StoreUnavailable,
)
from ratelimit_sidecar.storage.keys import DEFAULT_PREFIX, KeySchema

SCRIPTS = {algorithm: scripts.load(name) for algorithm, name in SCRIPT_FILES.items()}
THREAD_ABOVE = 2000  # pushes in a batch above which packing and parsing leave the loop
DEFAULT_NODE_TTL_MS = 30_000
T = TypeVar("T")


class RedisStorage:
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
        self.codec = SyncCodec(
            self.keys,
            cluster=isinstance(client, RedisCluster),
            node_id=node_id,
            node_ttl_ms=node_ttl_ms,
        )
        self.round_trips = 0  # pipelines sent
        self._description = description
        self._on_close = tuple(on_close)

    @property
    def description(self) -> str:
        return self._description

    async def sync(self, batch: SyncBatch) -> SyncResult:
        """Raises only `StoreError`s."""
        # Packing and parsing a large batch is pure string work: in a worker thread the event
        # loop keeps answering requests meanwhile (the GIL switches every 5 ms).
        big = len(batch.pushes) > THREAD_ABOVE
        encoded = await _maybe_thread(big, self.codec.encode, batch)
        replies = await self._send(encoded)
        for reply in replies:
            lost = connection_failure(reply)
            if lost is not None:
                raise lost from reply
        return await _maybe_thread(big, self.codec.decode, encoded.layout, replies)

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def close(self) -> None:
        await self.client.aclose()
        for closer in self._on_close:
            await closer()

    async def _send(self, encoded: Encoded) -> list[Any]:
        calls = list(zip(encoded.layout.scripts, encoded.script_args, strict=True))
        sent = [SCRIPTS[algorithm].evalsha(*args) for algorithm, args in calls]
        replies = await self._run([*sent, *encoded.commands], encoded.routing_keys())
        await self._reload_script(calls, replies)
        return replies

    async def _run(self, commands: list[Command], keys: set[str]) -> list[Any]:
        """Over connections made first; error replies come back in place."""
        try:
            connection = await self._connect(keys)
        except Exception as exc:
            await self._forget_topology()
            raise unsent_error(exc) from exc
        self.round_trips += 1
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                if connection is not None:  # not Cluster: a plain pipeline
                    cast(Pipeline, pipe).connection = connection  # it releases it at the end
                for command in commands:
                    pipe.execute_command(*command)
                return list(await pipe.execute(raise_on_error=False))
        except Exception as exc:
            await self._forget_topology()
            raise sent_error(exc) from exc

    async def _connect(self, keys: set[str]) -> Any:
        """Before writing: the connection to use, or on Cluster (None) each node's pooled one."""
        client = self.client
        if not isinstance(client, RedisCluster):
            return await ready_connection(client.connection_pool)
        await client.initialize()
        nodes = {node.name: node for key in keys if (node := client.get_node_from_key(key))}
        for node in nodes.values():
            connection = node.acquire_connection()
            try:
                await ensure_ready(connection)
            finally:
                node.release(connection)
        return None

    async def _reload_script(
        self, calls: Sequence[tuple[AlgorithmName, Command]], replies: list[Any]
    ) -> None:
        """EVAL the calls answered NOSCRIPT; if it cannot connect they stay so (not applied)."""
        missing = [i for i in range(len(calls)) if scripts.not_loaded(replies[i])]
        if not missing:
            return
        retry = [SCRIPTS[calls[i][0]].eval(*calls[i][1]) for i in missing]
        try:
            answers = await self._run(retry, {str(calls[i][1][1]) for i in missing})
        except StoreError as exc:
            if exc.may_have_applied:
                raise
            return
        for i, reply in zip(missing, answers, strict=True):
            replies[i] = reply

    async def _forget_topology(self) -> None:
        """On Cluster the next sync rediscovers the slot map (failover)."""
        if isinstance(self.client, RedisCluster):
            await self.client.aclose()


def unsent_error(exc: BaseException) -> StoreError:
    """Raised before anything was written: never applied."""
    if isinstance(exc, StoreError):
        return exc
    # Unavailable: refused, unreachable, timed out, no slot map.
    kind = StoreRefused if isinstance(exc, ResponseError) else StoreUnavailable
    return kind(f"{type(exc).__name__}: {exc}")


def sent_error(exc: BaseException) -> StoreError:
    """Raised while writing: it may have run, unless Cluster refused to route it (before any)."""
    if isinstance(exc, StoreError):
        return exc
    kind: type[StoreError] = StoreLost  # a broken connection, or anything unforeseen
    if isinstance(exc, RedisTimeoutError | TimeoutError):
        kind = StoreTimeout
    elif isinstance(exc, RedisClusterException):
        kind = StoreRefused
    return kind(f"{type(exc).__name__}: {exc}")


def connection_failure(reply: Any) -> StoreError | None:
    """A reply that is the connection's failure, not its command's (LOADING is): it may have run."""
    lost = isinstance(reply, RedisConnectionError | RedisTimeoutError | OSError)
    return sent_error(reply) if lost and not isinstance(reply, BusyLoadingError) else None


async def ready_connection(pool: ConnectionPool) -> Any:
    """A pooled connection, ready (`ensure_ready`); back in the pool if it cannot be made so."""
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        await ensure_ready(connection)
    except BaseException:
        await pool.release(connection)
        raise
    return connection


async def ensure_ready(connection: Any) -> None:
    """Connect, anew if the server closed it since: the pool does not look for a close, and
    one found after writing would make a sync that surely did not run look as if it might."""
    if connection.is_connected:
        try:
            stale = await connection.can_read()  # data nobody asked for, or end of stream
        except RedisConnectionError:
            stale = True
        if not stale:
            return
        await connection.disconnect()
    await connection.connect()


async def _maybe_thread(big: bool, func: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(func, *args) if big else func(*args)

"""The override store on Redis: the set every sidecar sharing the Redis (and the prefix) sees.

Three keys in one hash slot: the set, its version and the history. Every read and write is one
atomic `overrides.lua` call; a write publishes "<version>|<Redis TIME ms>" on the overrides
channel. A rollback computes the target from a read, then writes only if the version is still
the one read (retried a few times). Failures raise `StoreError`s.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from ratelimit_sidecar.overrides.store import (
    HISTORY,
    Change,
    Document,
    OverrideSnapshot,
    Touched,
    change_of,
    documents_at,
    rollback_touches,
)
from ratelimit_sidecar.storage import scripts
from ratelimit_sidecar.storage.errors import (
    StoreError,
    StoreLost,
    StoreRefused,
    StoreTimeout,
    StoreUnavailable,
)
from ratelimit_sidecar.storage.keys import KeySchema
from ratelimit_sidecar.storage.redis_store import (
    RedisStorage,
    ready_connection,
    sent_error,
    unsent_error,
)

log = logging.getLogger("ratelimit_sidecar.overrides")
SCRIPT = scripts.load("overrides.lua")
CHANNEL = "overrides"  # KeySchema.channel(CHANNEL): where every write is announced
ROLLBACK_ATTEMPTS = 5  # writes racing a rollback: read and try again this many times


class RedisOverrideStore:
    def __init__(
        self, client: Redis | RedisCluster, keys: KeySchema, description: str, *, owns: bool
    ) -> None:
        self.client = client
        self.keys = keys
        self.channel = keys.channel(CHANNEL)
        self._keys = [keys.overrides(part) for part in ("set", "version", "history")]
        self._description = description
        self._owns = owns  # close the client on `close` (not when the counters' store shares it)
        self.last_write_ms = 0  # Redis TIME of this store's latest applied write
        self._last = OverrideSnapshot(0, {})  # the latest set read: what a restore puts back

    @classmethod
    def sharing(cls, storage: RedisStorage) -> RedisOverrideStore:
        """Beside the counters: same client, same prefix."""
        return cls(storage.client, storage.keys, storage.description, owns=False)

    @property
    def description(self) -> str:
        return f"redis {self._description}"

    async def read(self) -> OverrideSnapshot:
        version, documents, _ = await self._read("set")
        if version == 0 and self._last.version > 0:
            version, documents = await self._restore(self._last)
        self._last = OverrideSnapshot(version, documents)
        return self._last

    async def history(self) -> tuple[Change, ...]:
        return (await self._read("history"))[2]

    async def put(self, document: Document, now_ms: int) -> int:
        await self._restore_if_lost()
        override_id = str(document["id"])
        version = await self._write("put", ((override_id, None, document),), now_ms)
        assert version is not None  # a put without an expected version always applies
        return version

    async def delete(self, override_id: str, now_ms: int) -> int | None:
        await self._restore_if_lost()
        return await self._write("delete", ((override_id, None, None),), now_ms)

    async def rollback(self, version: int, now_ms: int) -> int:
        await self._restore_if_lost()
        for _ in range(ROLLBACK_ATTEMPTS):
            current, documents, changes = await self._read("all")
            touched = rollback_touches(documents, documents_at(documents, version, changes))
            applied = await self._write("rollback", touched, now_ms, expected=current)
            if applied is not None:
                return applied
        raise StoreRefused(f"overrides changed during {ROLLBACK_ATTEMPTS} rollback attempts")

    async def close(self) -> None:
        if self._owns:
            await self.client.aclose()

    async def _read(self, what: str) -> tuple[int, dict[str, Document], tuple[Change, ...]]:
        try:
            reply = await self._call("read", what)
        except (StoreLost, StoreTimeout):  # a read may be sent again: once, on a new connection
            reply = await self._call("read", what)
        try:
            flat = [_text(item) for item in reply[1]]
            documents = {flat[i]: _document(flat[i + 1]) for i in range(0, len(flat), 2)}
            changes = tuple(change_of(json.loads(_text(record))) for record in reply[2])
            return int(reply[0]), documents, changes
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise StoreError(f"unreadable overrides under {self._keys[0]!r}: {exc}") from exc

    async def _restore(self, last: OverrideSnapshot) -> tuple[int, dict[str, Document]]:
        """Redis lost the set (flushed, no persistence): put back what this node knew, if first."""
        if await self._put_back(last):
            return last.version, dict(last.documents)
        version, documents, _ = await self._read("set")
        return version, documents

    async def _restore_if_lost(self) -> None:
        """Before a write, or it would restart the versions at 1 over an empty set for every node
        (the script does nothing when the set is there)."""
        if self._last.version > 0:
            await self._put_back(self._last)

    async def _put_back(self, last: OverrideSnapshot) -> bool:
        """True if Redis had no version and `last` was written."""
        pairs = [part for i, d in last.documents.items() for part in _triple(i, d)[::2]]
        reply = await self._call("restore", str(last.version), self.channel, *pairs)
        if int(reply[0]) != 1:
            return False
        log.warning("overrides restored at version %d: Redis had lost them", last.version)
        return True

    async def _write(
        self, action: str, touched: Sequence[Touched], now_ms: int, *, expected: int | None = None
    ) -> int | None:
        """None if nothing was written (deleting an absent override, or `expected` is stale)."""
        parts = [part for i, _before, after in touched for part in _triple(i, after)]
        head = (action, "" if expected is None else str(expected), str(int(now_ms)))
        reply = await self._call(*head, str(HISTORY), self.channel, *parts)
        if int(reply[0]) != 1:
            return None
        self.last_write_ms = int(reply[2])
        return int(reply[1])

    async def _call(self, *args: str) -> Any:
        try:
            return await scripts.call(self._send, SCRIPT, 3, *self._keys, *args)
        except Exception as exc:
            raise _failure(exc) from exc

    async def _send(self, *command: Any) -> Any:
        """On a connection made ready first: a closed one must not fail a write that did not run."""
        client = self.client
        if isinstance(client, RedisCluster):
            await client.initialize()
            return await client.execute_command(*command)
        try:
            connection = await ready_connection(client.connection_pool)
        except Exception as exc:
            raise unsent_error(exc) from exc
        try:
            await connection.send_command(*command)
            return await connection.read_response()
        except ResponseError:
            raise  # an error reply: the connection is fine
        except BaseException:
            await connection.disconnect()  # half a reply may be left on it
            raise
        finally:
            await client.connection_pool.release(connection)


def _triple(override_id: str, after: Document | None) -> tuple[str, str, str]:
    text = "" if after is None else json.dumps(after, separators=(",", ":"))
    return override_id, json.dumps(override_id), text


def _document(text: str) -> Document:
    document = json.loads(text)
    if not isinstance(document, Mapping):
        raise ValueError(f"an override is not a JSON object: {text[:80]!r}")
    return document


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _failure(exc: BaseException) -> StoreError:
    """A connect failure or a refusal ran nothing; anything else may have been applied."""
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, ResponseError):
        return StoreRefused(f"overrides script refused: {exc}")
    if isinstance(exc, RedisConnectionError | OSError) and "connecting" in str(exc):
        return StoreUnavailable(f"{type(exc).__name__}: {exc}")  # Cluster: before sending
    return sent_error(exc)

"""Strict checks on Redis: a request's strict limits decided by one script call per hash slot.

Groups run concurrently, each all-or-nothing. Slots share no transaction: when one refuses, the
groups that counted get the hits negated (`_give_back`): counted nowhere in the end, though others
may see them in between. Strict and eventual counts land in the same keys; the caller bounds the
call, and any failure raises `StoreError`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

from redis.asyncio import RedisCluster
from redis.exceptions import ResponseError

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core.types import KeyId
from ratelimit_sidecar.storage import scripts
from ratelimit_sidecar.storage.codec import by_slot, penalty_spec
from ratelimit_sidecar.storage.errors import StoreError, StoreUnavailable
from ratelimit_sidecar.storage.keys import counter_suffix, digest
from ratelimit_sidecar.storage.redis_store import RedisStorage, sent_error

STRICT = scripts.load("strict.lua")


class StrictCheck(NamedTuple):
    """`key` names its counter as the limiter does."""

    key: KeyId
    limit: RateLimit
    hits: int
    shadow: bool


class StrictAnswer(NamedTuple):
    """`reset_ms`: until reset (admitted) or until a retry fits (refused)."""

    fits: bool
    remaining: int
    reset_ms: int
    counted: bool  # the call that held this limit applied its hits
    now_ms: int  # Redis TIME when the check ran


class StrictStore:
    def __init__(self, storage: RedisStorage) -> None:
        self.client = storage.client
        self.keys = storage.keys
        self._blocks_channel = storage.codec.blocks_channel  # the sync scripts' channel
        self.cluster = isinstance(storage.client, RedisCluster)
        # Sliding log members must be unique across the fleet: a random token per process,
        # then a sequence number per call.
        self._token = os.urandom(6).hex()
        self._calls = itertools.count()

    async def check(self, checks: Sequence[StrictCheck]) -> list[StrictAnswer]:
        """Raises `StoreError` if any group failed."""
        groups = self._groups(checks)
        if self.cluster:  # concurrent first calls on a client without a slot map fail
            await self._initialize()
        if len(groups) == 1:  # standalone and Sentinel always: awaited here, no task to gather
            return await self._call(checks)
        replies = await asyncio.gather(*(self._call([checks[i] for i in g]) for g in groups))
        if not all(reply[0].counted for reply in replies):
            replies = await self._give_back(checks, groups, replies)
        by_index = dict(zip(itertools.chain(*groups), itertools.chain(*replies), strict=True))
        return [by_index[index] for index in range(len(checks))]

    async def _give_back(
        self,
        checks: Sequence[StrictCheck],
        groups: list[list[int]],
        replies: Sequence[list[StrictAnswer]],
    ) -> list[list[StrictAnswer]]:
        """If giving back fails, the hits stay counted (refusing more, never admitting more)."""
        undo = [
            (group, reply)
            for group, reply in zip(groups, replies, strict=True)
            if reply[0].counted and any(checks[i].hits > 0 for i in group)
        ]
        calls = [self._call([checks[i]._replace(hits=-checks[i].hits) for i in g]) for g, _ in undo]
        try:
            await asyncio.gather(*calls)
        except StoreError:
            return list(replies)
        undone = {id(reply) for _, reply in undo}
        return [
            [_not_counted(a, checks[i].hits) for i, a in zip(group, reply, strict=True)]
            if id(reply) in undone
            else reply
            for group, reply in zip(groups, replies, strict=True)
        ]

    def _groups(self, checks: Sequence[StrictCheck]) -> list[list[int]]:
        if not self.cluster:
            return [list(range(len(checks)))]
        return by_slot(enumerate(check.key for check in checks))

    async def prepare(self) -> bool:
        """Slot map and script loaded before the first request's timeout; False: no Redis yet."""
        try:
            if self.cluster:
                await self._initialize()
            await self.client.script_load(STRICT.source)
        except Exception:  # the first strict check tries again; on_store_failure covers it
            return False
        return True

    async def _initialize(self) -> None:
        try:
            await cast(RedisCluster, self.client).initialize()
        except Exception as exc:
            raise StoreUnavailable(f"{type(exc).__name__}: {exc}") from exc

    async def _call(self, checks: Sequence[StrictCheck]) -> list[StrictAnswer]:
        route = self.keys.flag(checks[0].key)
        token = f"{self._token}.{next(self._calls)}"
        entries = ";".join(_entry(c) for c in checks)
        args = (1, route, self.keys.prefix, token, entries, self._blocks_channel)
        try:
            reply = await scripts.call(self.client.execute_command, STRICT, *args)
        except Exception as exc:
            raise _failure(exc) from exc
        return _answers(reply, len(checks))


def _entry(check: StrictCheck) -> str:
    """strict.lua's entry:
    algorithm|digest|base|hits|max|window_ms|spans|capacity|cooldown_ms|shadow|penalty."""
    limit, key = check.limit, check.key
    head = (int(limit.algorithm), digest(key), counter_suffix(key, ""), check.hits)
    sizes = (limit.requests_per_unit, limit.window_ms, limit.spans, limit.capacity, limit.cooldown)
    return "|".join(str(f) for f in (*head, *sizes, int(check.shadow), penalty_spec(limit, 0)))


def _answers(reply: Any, count: int) -> list[StrictAnswer]:
    values = [int(v) for v in reply]
    if len(values) != 2 + 3 * count:
        raise StoreError(f"strict script answered {len(values)} values for {count} limits")
    now, counted = values[0], values[1] == 1
    return [
        StrictAnswer(values[i] == 1, values[i + 1], values[i + 2], counted, now)
        for i in range(2, len(values), 3)
    ]


def _not_counted(answer: StrictAnswer, hits: int) -> StrictAnswer:
    return answer._replace(counted=False, remaining=answer.remaining + max(0, hits))


def _failure(exc: BaseException) -> StoreError:
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, ResponseError):
        return StoreError(f"strict script failed: {exc}")
    return sent_error(exc)

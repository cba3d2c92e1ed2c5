"""RedisStorage over a scripted client: which typed error each failure becomes, NOSCRIPT repair."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis.exceptions as rex

from ratelimit_sidecar.config.model import RateLimit, Unit
from ratelimit_sidecar.core.types import Push, SyncBatch
from ratelimit_sidecar.storage.errors import (
    StoreError,
    StoreRefused,
    StoreTimeout,
    StoreUnavailable,
)
from ratelimit_sidecar.storage.redis_store import SYNC_SCRIPT, SYNC_SHA, RedisStorage, store_error

LIMIT = RateLimit(requests_per_unit=10, unit=Unit.MINUTE, cooldown_ms=5000)
BATCH = SyncBatch(1_000, [Push(("d", "k", "v"), 7, 2, LIMIT)])
Answer = Callable[[list[tuple[Any, ...]]], list[Any]]


class ScriptedPipeline:
    def __init__(self, answer: Answer, sent: list[list[tuple[Any, ...]]]) -> None:
        self.answer, self.sent = answer, sent
        self.commands: list[tuple[Any, ...]] = []

    async def __aenter__(self) -> ScriptedPipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def execute_command(self, *args: Any) -> None:
        self.commands.append(args)

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        assert not raise_on_error  # error replies must come back in place
        self.sent.append(self.commands)
        return self.answer(self.commands)


class ScriptedClient:
    """Stands in for redis.asyncio.Redis: each pipeline is answered by `answer`."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.sent: list[list[tuple[Any, ...]]] = []

    def pipeline(self, transaction: bool) -> ScriptedPipeline:
        assert not transaction
        return ScriptedPipeline(self.answer, self.sent)


def store(answer: Answer) -> tuple[RedisStorage, ScriptedClient]:
    client = ScriptedClient(answer)
    return RedisStorage(client, description="scripted", prefix="t:"), client  # type: ignore[arg-type]


def good(commands: list[tuple[Any, ...]]) -> list[Any]:
    """Answers a one-push batch without heartbeat: the script, then TIME."""
    return [b"2,0" if c[0] in ("EVALSHA", "EVAL") else (1, 500) for c in commands]


def raising(exc: BaseException) -> Answer:
    def answer(commands: list[tuple[Any, ...]]) -> list[Any]:
        raise exc

    return answer


async def test_a_sync_is_one_pipeline_of_evalsha_then_time() -> None:
    storage, client = store(good)
    result = await storage.sync(BATCH)
    assert [(p.total, p.block_ms) for p in result.pushes] == [(2, 0)]
    assert [c[:2] for c in client.sent[0]] == [("EVALSHA", SYNC_SHA), ("TIME",)]
    assert storage.round_trips == 1


async def test_noscript_is_repaired_with_eval_in_one_more_trip() -> None:
    def answer(commands: list[tuple[Any, ...]]) -> list[Any]:
        if commands[0][0] == "EVALSHA":
            return [rex.NoScriptError("NOSCRIPT No matching script."), (1, 500)]
        return [b"2,0"]

    storage, client = store(answer)
    result = await storage.sync(BATCH)
    assert result.pushes[0].total == 2
    assert client.sent[1] == [("EVAL", SYNC_SCRIPT, *client.sent[0][0][2:])]
    assert storage.round_trips == 2


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        (rex.TimeoutError("Timeout reading from 127.0.0.1:6379"), StoreTimeout),
        (rex.ConnectionError("Error 111 connecting to 127.0.0.1:6379"), StoreUnavailable),
        (rex.AuthenticationError("invalid username-password pair"), StoreUnavailable),
        (rex.ResponseError("OOM command not allowed"), StoreRefused),
    ],
)
async def test_a_failed_pipeline_raises_its_typed_error(
    failure: Exception, kind: type[StoreError]
) -> None:
    storage, _ = store(raising(failure))
    with pytest.raises(kind) as raised:
        await storage.sync(BATCH)
    assert raised.value.__cause__ is failure
    assert type(failure).__name__ in str(raised.value)


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (rex.ReadOnlyError("READONLY You can't write against a read only replica."), StoreRefused),
        (rex.ResponseError("WRONGTYPE Operation against a key"), StoreRefused),
        (rex.TimeoutError("Timeout reading from node"), StoreTimeout),  # Cluster: per node
        (rex.ConnectionError("Connection closed by server."), StoreUnavailable),
    ],
)
async def test_an_error_reply_in_place_raises_its_typed_error(
    reply: Exception, kind: type[StoreError]
) -> None:
    storage, _ = store(lambda commands: [reply, (1, 500)])
    with pytest.raises(kind) as raised:
        await storage.sync(BATCH)
    assert raised.value.__cause__ is reply


async def test_an_unparsable_answer_is_refused() -> None:
    storage, _ = store(lambda commands: [b"2", (1, 500)])
    with pytest.raises(StoreRefused):
        await storage.sync(BATCH)


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        (TimeoutError(), StoreTimeout),
        (ConnectionRefusedError(111, "refused"), StoreUnavailable),
        (rex.RedisClusterException("Redis Cluster cannot be connected"), StoreUnavailable),
        (rex.ClusterDownError("CLUSTERDOWN The cluster is down"), StoreRefused),
        (rex.OutOfMemoryError("OOM"), StoreRefused),
        (ValueError("odd"), StoreRefused),
    ],
)
def test_store_error_classifies_what_redis_py_raises(
    failure: Exception, kind: type[StoreError]
) -> None:
    assert type(store_error(failure)) is kind


def test_only_timeouts_may_have_applied() -> None:
    assert StoreTimeout.may_have_applied
    assert not StoreUnavailable.may_have_applied and not StoreRefused.may_have_applied
    already = StoreRefused("x")
    assert store_error(already) is already

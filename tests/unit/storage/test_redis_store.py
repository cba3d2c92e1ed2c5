"""RedisStorage over a scripted client: which typed error each failure becomes (by whether
anything was sent), error replies answered per command, NOSCRIPT repair."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis.exceptions as rex

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Unit
from ratelimit_sidecar.core.types import Push, SyncBatch
from ratelimit_sidecar.storage.errors import (
    StoreError,
    StoreLost,
    StoreRefused,
    StoreTimeout,
    StoreUnavailable,
    StoreUnreadable,
)
from ratelimit_sidecar.storage.redis_store import (
    SCRIPTS,
    RedisStorage,
    sent_error,
    unsent_error,
)

LIMIT = RateLimit(requests_per_unit=10, unit=Unit.MINUTE, cooldown_ms=5000)
BATCH = SyncBatch(1_000, [Push(("d", "k", "v"), 7, 2, LIMIT)])
Answer = Callable[[list[tuple[Any, ...]]], list[Any]]


class ScriptedPipeline:
    def __init__(self, answer: Answer, sent: list[list[tuple[Any, ...]]]) -> None:
        self.answer, self.sent = answer, sent
        self.commands: list[tuple[Any, ...]] = []
        self.connection: object | None = None

    async def __aenter__(self) -> ScriptedPipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def execute_command(self, *args: Any) -> None:
        self.commands.append(args)

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        assert not raise_on_error  # error replies must come back in place
        assert self.connection is not None  # connected before anything is written
        self.sent.append(self.commands)
        return self.answer(self.commands)


class ScriptedConnection:
    """A pooled connection; `closed`: the server closed it since its last use."""

    def __init__(self) -> None:
        self.is_connected, self.closed, self.connects = True, False, 0

    async def can_read(self) -> bool:
        return self.closed

    async def disconnect(self) -> None:
        self.is_connected = False

    async def connect(self) -> None:
        self.is_connected, self.closed, self.connects = True, False, self.connects + 1


class ScriptedPool:
    """Hands out one connection, or fails to connect with `refusal` (nothing is sent then)."""

    def __init__(self) -> None:
        self.refusal: Exception | None = None
        self.connection = ScriptedConnection()
        self.released = 0

    async def get_connection(self) -> ScriptedConnection:
        if self.refusal is not None:
            raise self.refusal
        return self.connection

    async def release(self, connection: ScriptedConnection) -> None:
        self.released += 1


class ScriptedClient:
    """Stands in for redis.asyncio.Redis: each pipeline is answered by `answer`."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.sent: list[list[tuple[Any, ...]]] = []
        self.connection_pool = ScriptedPool()

    def pipeline(self, transaction: bool) -> ScriptedPipeline:
        assert not transaction
        return ScriptedPipeline(self.answer, self.sent)


def store(answer: Answer) -> tuple[RedisStorage, ScriptedClient]:
    client = ScriptedClient(answer)
    return RedisStorage(client, description="scripted", prefix="t:"), client  # type: ignore[arg-type]


def good(commands: list[tuple[Any, ...]]) -> list[Any]:
    """Answers a one-push batch without heartbeat: the script alone."""
    return [b"2,0" for _ in commands]


def raising(exc: BaseException) -> Answer:
    def answer(commands: list[tuple[Any, ...]]) -> list[Any]:
        raise exc

    return answer


async def test_a_sync_is_one_pipeline_of_its_script_calls() -> None:
    storage, client = store(good)
    result = await storage.sync(BATCH)
    assert [(p.total, p.block_ms) for p in result.pushes] == [(2, 0)]
    assert [c[:2] for c in client.sent[0]] == [
        ("EVALSHA", SCRIPTS[AlgorithmName.FIXED_WINDOW].sha),
    ]
    assert storage.round_trips == 1


async def test_noscript_is_repaired_with_eval_in_one_more_trip() -> None:
    def answer(commands: list[tuple[Any, ...]]) -> list[Any]:
        if commands[0][0] == "EVALSHA":
            return [rex.NoScriptError("NOSCRIPT No matching script.")]
        return [b"2,0"]

    storage, client = store(answer)
    result = await storage.sync(BATCH)
    assert result.pushes[0].total == 2
    assert client.sent[1] == [
        ("EVAL", SCRIPTS[AlgorithmName.FIXED_WINDOW].source, *client.sent[0][0][2:])
    ]
    assert storage.round_trips == 2


async def test_each_algorithm_calls_its_own_script_and_reloads_it_by_name() -> None:
    sliding = RateLimit(10, Unit.MINUTE, spans=2, algorithm=AlgorithmName.SLIDING_WINDOW)
    bucket = RateLimit(10, Unit.MINUTE, algorithm=AlgorithmName.TOKEN_BUCKET)
    pushes = [Push(("d", "k", "b"), 7, 2, bucket), Push(("d", "k", "s"), 7, 1, sliding)]
    answers = {SCRIPTS[AlgorithmName.TOKEN_BUCKET].sha: b"12000,0", "sliding": b"3,0,2 1"}

    def answer(commands: list[tuple[Any, ...]]) -> list[Any]:
        if commands[0][0] == "EVAL":  # the reload: the sliding window's source, by name
            assert commands == [
                ("EVAL", SCRIPTS[AlgorithmName.SLIDING_WINDOW].source, *commands[0][2:])
            ]
            return [answers["sliding"]]
        noscript = rex.NoScriptError("NOSCRIPT No matching script.")
        return [answers.get(c[1], noscript) for c in commands[:2]]

    storage, client = store(answer)
    result = await storage.sync(SyncBatch(1_000, pushes))
    assert [(p.total, p.spans) for p in result.pushes] == [(12_000, ()), (3, (2, 1))]
    sent_shas = [c[1] for c in client.sent[0][:2]]
    assert sent_shas == [
        SCRIPTS[a].sha for a in (AlgorithmName.TOKEN_BUCKET, AlgorithmName.SLIDING_WINDOW)
    ]
    assert len({script.sha for script in SCRIPTS.values()}) == len(SCRIPTS) == 3


async def test_a_connection_the_server_closed_is_made_anew_before_sending() -> None:
    storage, client = store(good)
    client.connection_pool.connection.closed = True
    assert (await storage.sync(BATCH)).pushes[0].total == 2
    assert client.connection_pool.connection.connects == 1


async def test_a_second_trip_that_cannot_connect_leaves_those_keys_not_applied() -> None:
    def answer(commands: list[tuple[Any, ...]]) -> list[Any]:
        client.connection_pool.refusal = rex.ConnectionError("Error 111 connecting")
        return [rex.NoScriptError("NOSCRIPT No matching script.")]

    storage, client = store(answer)
    result = await storage.sync(BATCH)
    assert result.pushes[0].error.startswith("NOSCRIPT")


@pytest.mark.parametrize(
    "failure",
    [
        rex.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
        rex.TimeoutError("Timeout connecting to server"),
        rex.AuthenticationError("invalid username-password pair"),
        OSError(113, "No route to host"),
    ],
)
async def test_a_failure_to_connect_is_unavailable_and_surely_not_applied(
    failure: Exception,
) -> None:
    storage, client = store(good)
    client.connection_pool.refusal = failure
    with pytest.raises(StoreUnavailable) as raised:
        await storage.sync(BATCH)
    assert raised.value.__cause__ is failure and not raised.value.may_have_applied
    assert client.sent == [] and storage.round_trips == 0


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        (rex.TimeoutError("Timeout reading from 127.0.0.1:6379"), StoreTimeout),
        (rex.ConnectionError("Connection closed by server."), StoreLost),
        (rex.ConnectionError("Error 32 while writing to socket. Broken pipe."), StoreLost),
        (rex.BusyLoadingError("Redis is loading the dataset in memory"), StoreLost),
        (ValueError("a bug"), StoreLost),
    ],
)
async def test_a_pipeline_that_fails_once_sent_may_have_been_applied(
    failure: Exception, kind: type[StoreError]
) -> None:
    storage, _ = store(raising(failure))
    with pytest.raises(kind) as raised:
        await storage.sync(BATCH)
    assert raised.value.__cause__ is failure and raised.value.may_have_applied
    assert type(failure).__name__ in str(raised.value)


async def test_a_cluster_routing_refusal_is_raised_before_sending() -> None:
    failure = rex.SlotNotCoveredError('Slot "7" is not covered by the cluster.')
    storage, _ = store(raising(failure))
    with pytest.raises(StoreRefused) as raised:
        await storage.sync(BATCH)
    assert not raised.value.may_have_applied


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (rex.TimeoutError("Timeout reading from node"), StoreTimeout),  # Cluster: per node
        (rex.ConnectionError("Connection closed by server."), StoreLost),
    ],
)
async def test_a_connection_failure_in_place_fails_the_sync_as_maybe_applied(
    reply: Exception, kind: type[StoreError]
) -> None:
    storage, _ = store(lambda commands: [b"2,0", reply])
    with pytest.raises(kind) as raised:
        await storage.sync(BATCH)
    assert raised.value.__cause__ is reply and raised.value.may_have_applied


@pytest.mark.parametrize(
    "reply",
    [
        rex.ReadOnlyError("READONLY You can't write against a read only replica."),
        rex.OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'."),
        rex.MovedError("3999 127.0.0.1:6381"),
        rex.AskError("3999 127.0.0.1:6381"),
        rex.ClusterCrossSlotError("CROSSSLOT Keys in request don't hash to the same slot"),
        rex.BusyLoadingError("LOADING Redis is loading the dataset in memory"),
        rex.ResponseError("BUSY Redis is busy running a script."),
    ],
)
async def test_an_error_reply_to_the_script_fails_only_its_keys(reply: Exception) -> None:
    storage, _ = store(lambda commands: [reply])
    result = await storage.sync(BATCH)
    assert result.pushes[0].error and (result.pushes[0].total, result.pushes[0].block_ms) == (0, 0)


async def test_an_unparsable_answer_may_have_been_applied() -> None:
    storage, _ = store(lambda commands: [b"2"])
    with pytest.raises(StoreUnreadable) as raised:
        await storage.sync(BATCH)
    assert raised.value.may_have_applied


def test_only_failures_after_sending_may_have_applied() -> None:
    assert StoreTimeout.may_have_applied and StoreLost.may_have_applied
    assert StoreUnreadable.may_have_applied
    assert not StoreUnavailable.may_have_applied and not StoreRefused.may_have_applied
    assert StoreLost.kind == StoreUnavailable.kind == "connection"
    already = StoreRefused("x")
    assert sent_error(already) is already and unsent_error(already) is already

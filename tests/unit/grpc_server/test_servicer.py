"""RateLimitServicer: bytes at once for a request decided from memory, an awaitable for one with
a strict limit (the store's answer), gRPC statuses for bad requests, and one call in
TIMED_EVERY timed for the decision histogram."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.grpc_server.rls import TIMED_EVERY, RateLimitServicer
from ratelimit_sidecar.grpc_server.transport.status import CallError
from ratelimit_sidecar.storage.strict_store import StrictAnswer, StrictCheck
from tests.unit.service.strict_rules import T0, strict_handler


class RefusingStore:
    """Answers every strict check: over the limit, retry in 30 s."""

    calls = 0

    async def check(self, checks: Sequence[StrictCheck]) -> list[StrictAnswer]:
        self.calls += 1
        await asyncio.sleep(0)  # a real round trip suspends
        return [StrictAnswer(False, 0, 30_000, False, T0) for _ in checks]


def servicer(tmp_path: Path, store: RefusingStore, timed: list[float]) -> RateLimitServicer:
    handler = strict_handler(tmp_path, store, strict_max=1, eventual_max=100, timeout_ms=1000)
    return RateLimitServicer(handler, timed.append)


def raw(key: str) -> bytes:
    return request("d", [(key, "x")]).SerializeToString()


def test_a_decision_from_memory_is_bytes_and_one_call_in_timed_every_is_timed(
    tmp_path: Path,
) -> None:
    timed: list[float] = []
    answer = servicer(tmp_path, RefusingStore(), timed).answer
    answers = [answer(raw("eventual")) for _ in range(2 * TIMED_EVERY + 1)]
    assert all(isinstance(a, bytes) for a in answers)
    codes = {wire.RateLimitResponse.FromString(a).overall_code for a in answers}  # type: ignore[arg-type]
    assert codes == {wire.Code.OK}
    assert len(timed) == 3 and all(0 <= seconds < 1 for seconds in timed)  # calls 1, 17, 33


def test_a_strict_request_is_awaited_and_answered_by_the_store(tmp_path: Path) -> None:
    store, timed = RefusingStore(), list[float]()
    pending = servicer(tmp_path, store, timed).answer(raw("strict"))
    assert inspect.isawaitable(pending) and store.calls == 0  # nothing asked before it is awaited

    async def awaited() -> bytes:
        return await pending

    answer = wire.RateLimitResponse.FromString(asyncio.run(awaited()))
    assert answer.overall_code == wire.Code.OVER_LIMIT and store.calls == 1
    assert len(timed) == 1  # the first call is timed, the store's wait included


def test_a_bad_request_is_invalid_argument(tmp_path: Path) -> None:
    answer = servicer(tmp_path, RefusingStore(), []).answer
    for _ in range(2):  # timed and untimed calls alike
        with pytest.raises(CallError) as raised:
            answer(b"\xff\xff")
        assert raised.value.code is grpc.StatusCode.INVALID_ARGUMENT

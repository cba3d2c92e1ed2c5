"""run_inline: a coroutine's first step in the caller; the rest, if any, in the awaiting task."""

from __future__ import annotations

import asyncio

import pytest

from ratelimit_sidecar.server.transport.inline import Resumed, run_inline


async def answer_now() -> bytes:
    return b"now"


async def answer_later(gate: asyncio.Future[bytes], seen: list[str]) -> bytes:
    seen.append("started")
    try:
        value = await gate
    except asyncio.CancelledError:
        seen.append("cancelled")
        raise
    seen.append("resumed")
    return value + b"!"


def test_a_coroutine_that_never_suspends_gives_its_value_in_the_caller() -> None:
    assert run_inline(answer_now()) == b"now"


async def test_a_suspended_coroutine_carries_on_in_the_awaiting_task() -> None:
    gate: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    seen: list[str] = []
    resumed = run_inline(answer_later(gate, seen))
    assert isinstance(resumed, Resumed) and seen == ["started"]  # the first step ran here

    async def finish() -> bytes:
        return await resumed

    task = asyncio.create_task(finish())
    await asyncio.sleep(0)
    gate.set_result(b"later")
    assert await task == b"later!"
    assert seen == ["started", "resumed"]


async def test_cancelling_the_task_reaches_the_coroutine() -> None:
    gate: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    seen: list[str] = []
    resumed = run_inline(answer_later(gate, seen))
    assert isinstance(resumed, Resumed)

    async def finish() -> bytes:
        return await resumed

    task = asyncio.create_task(finish())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["started", "cancelled"]

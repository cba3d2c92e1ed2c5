"""bench/frameloop.py: the fast transport's frame loop in one process, timed per call."""

from __future__ import annotations

import asyncio

import pytest

from bench import frameloop, services

BODIES = [bytes([0x0A, 1, 0x61 + i]) for i in range(4)]  # any bytes: the answers ignore them
PREBUILT = services.answer(1).SerializeToString()


def chunks(count: int) -> list[bytes]:
    return frameloop.reads(BODIES, frameloop.WARM_UP_READS + count, frameloop.CALLS_PER_READ)


def test_every_call_is_answered_and_timed_per_call() -> None:
    seen: list[bytes] = []

    def answer(body: bytes) -> bytes:
        seen.append(body)
        return PREBUILT

    assert frameloop.answered(answer, chunks(10)) > 0
    assert len(seen) == frameloop.CALLS_PER_READ * (frameloop.WARM_UP_READS + 10)
    assert set(seen) == set(BODIES)


def test_calls_left_unanswered_stop_the_run() -> None:
    """An answer that never comes is a failed measurement, not a fast one."""

    def never(_body: bytes) -> asyncio.Future[bytes]:
        return asyncio.get_running_loop().create_future()

    with pytest.raises(SystemExit, match="calls open"):
        frameloop.answered(never, chunks(1))

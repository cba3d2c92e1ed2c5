"""Local-only mode's background task: no store to sync with, only idle keys to forget."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ratelimit_sidecar.core import LocalLimiter
from ratelimit_sidecar.core.local import SWEEP_EVERY_MS
from ratelimit_sidecar.periodic import every


class SweepLoop:
    """Calls `LocalLimiter.sweep` every SWEEP_EVERY_MS. Counts live in memory only, so there is
    no store to be down and nothing to flush at shutdown."""

    store_up = True
    last_error = ""
    key_errors = 0
    heartbeat_error = ""

    def __init__(self, limiter: LocalLimiter, clock_ms: Callable[[], int]) -> None:
        self.limiter = limiter
        self._clock_ms = clock_ms
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        async for _ in every(SWEEP_EVERY_MS / 1000, self._stop):
            for _ in self.limiter.sweep_steps(self._clock_ms()):
                await asyncio.sleep(0)  # let requests in between slices

    async def flush(self) -> int:
        return 0

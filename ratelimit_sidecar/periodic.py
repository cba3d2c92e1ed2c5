"""A background task's clock: one tick every period until it is asked to stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


async def every(period_s: float, stop: asyncio.Event) -> AsyncIterator[None]:
    """Yield once per `period_s`; end as soon as `stop` is set, even mid-wait."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), period_s)
            return
        except TimeoutError:
            yield

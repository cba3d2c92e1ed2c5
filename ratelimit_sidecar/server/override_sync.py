"""Following the shared override set: every node applies a change within a second.

Each write on Redis publishes "<version>|<Redis TIME ms>" (storage/overrides_redis.py). A node
that hears of a version newer than its own has its keeper read the whole set again; a burst of
writes costs few reads, because while one read runs, any number of messages ask for one more
read after it, no more. Messages are the fast path only: on every (re)subscription, and every
`interval_s` besides, the set is read in full, which repairs whatever message was lost (a
dropped pub/sub connection, Redis restarted). A failed read leaves the keeper's last set in
force; the next message, reconnection or interval reads again.

The lag from the write (Redis TIME) to this node's read that applied it, on the node's store
clock (server/storeclock.py, also on Redis TIME), goes to `observe_lag` in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from ratelimit_sidecar.storage.keys import KeySchema
from ratelimit_sidecar.storage.overrides_redis import CHANNEL
from ratelimit_sidecar.storage.subscriber import Subscriber

log = logging.getLogger("ratelimit_sidecar.overrides")

MAX_PENDING = 1000  # announced versions awaiting a read, for the lag: the newest are kept
LOG_EVERY_S = 10.0  # failed reads are logged at most this often


class Refreshable(Protocol):
    """What this needs of the keeper: the version in force and a full read of the store."""

    @property
    def version(self) -> int: ...

    async def refresh(self) -> object: ...


class OverrideFollower:
    """Keeps one node's keeper up to date with the store, from messages and full reads."""

    def __init__(
        self,
        keeper: Refreshable,
        clock_ms: Callable[[], int],
        observe_lag: Callable[[float], None],
        *,
        interval_s: float,
    ) -> None:
        self.keeper = keeper
        self._clock_ms = clock_ms
        self._observe_lag = observe_lag
        self._interval_s = interval_s
        self._announced: dict[int, int] = {}  # version -> its write's Redis TIME ms
        self._task: asyncio.Task[None] | None = None
        self._again = False
        self._stop = asyncio.Event()
        self._logged_at = -LOG_EVERY_S
        self.reads = 0  # full reads started (tests and the bench count them)
        self.failures = 0

    def attach(self, subscriber: Subscriber, keys: KeySchema) -> None:
        """Listen on the node's subscriber; its reconnection also triggers a full read."""
        subscriber.on(keys.channel(CHANNEL), self.on_message)
        previous = subscriber.on_connect  # the subscriber is shared: keep the others' hook

        def on_connect() -> None:
            if previous is not None:
                previous()
            self.request()

        subscriber.on_connect = on_connect

    def on_message(self, data: bytes) -> None:
        """A write was announced: read the set unless this node has that version already."""
        version_text, _, written_text = data.decode("ascii", "replace").partition("|")
        try:
            version, written_ms = int(version_text), int(written_text or 0)
        except ValueError:
            log.warning("ignored an overrides message that is not version|time: %r", data[:80])
            return
        if version <= self.keeper.version:
            return
        if written_ms > 0:
            self._announced[version] = written_ms
            while len(self._announced) > MAX_PENDING:
                del self._announced[min(self._announced)]
        self.request()

    def request(self) -> None:
        """Read the set now, or once more after the read under way (bursts coalesce)."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._reads(), name="overrides-read")

    async def run(self) -> None:
        """The periodic full read, until `stop`."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._interval_s)
            if not self._stop.is_set():
                self.request()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _reads(self) -> None:
        self._again = True
        while self._again and not self._stop.is_set():
            self._again = False
            self.reads += 1
            try:
                await self.keeper.refresh()
            except Exception as exc:  # the last set stays in force; the next trigger retries
                self._failed(exc)
                continue
            self._applied()

    def _applied(self) -> None:
        """Each announced version now in force took this long from its write to here."""
        version, now_ms = self.keeper.version, self._clock_ms()
        for announced in [v for v in self._announced if v <= version]:
            self._observe_lag(max(0, now_ms - self._announced.pop(announced)) / 1000)

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        now = asyncio.get_running_loop().time()
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            log.warning(
                "reading the overrides failed (%s: %s); the last set read stays in force",
                type(exc).__name__,
                exc,
            )

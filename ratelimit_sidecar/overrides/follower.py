"""Following the shared override set: every node applies a change within a second.

Each write on Redis publishes "<version>|<Redis TIME ms>" (overrides/redis_store.py). A node
that hears of a version other than its own has its keeper read the whole set again; a burst of
writes costs few reads, because while one read runs, any number of messages ask for one more
read after it, no more. Messages are the fast path only: on every (re)subscription the set is
read in full, and the keeper reads it every `--overrides-refresh-s` besides, which repairs
whatever message was lost (a dropped pub/sub connection, Redis restarted). A failed read leaves
the keeper's last set in force (and it logs why); the next message, reconnection or periodic
read tries again.

The lag from the write (Redis TIME) to this node's read that applied it, on the node's store
clock (sync/store_clock.py, also on Redis TIME), goes to the keeper's histogram
(`overrides_propagation_seconds`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from ratelimit_sidecar.overrides.redis_store import CHANNEL
from ratelimit_sidecar.overrides.store import OverrideSnapshot
from ratelimit_sidecar.storage.keys import KeySchema
from ratelimit_sidecar.storage.redis_store import RedisStorage
from ratelimit_sidecar.storage.subscriber import Subscriber

log = logging.getLogger("ratelimit_sidecar.overrides")

MAX_PENDING = 1000  # announced versions awaiting a read, for the lag: the newest are kept
MAX_READS_KEPT = 64  # recent reads (version, when), for messages that arrive after their read


class Refreshable(Protocol):
    """What this needs of the keeper (overrides/keeper.py): the set in force, a full read of
    the store (False: it failed, the last set stays) and the lag histogram."""

    @property
    def snapshot(self) -> OverrideSnapshot: ...

    async def refresh(self) -> bool: ...

    def observe_propagation(self, seconds: float) -> None: ...


class OverrideFollower:
    """Keeps one node's keeper up to date with the store, from messages and full reads."""

    def __init__(self, keeper: Refreshable, clock_ms: Callable[[], int]) -> None:
        self.keeper = keeper
        self._clock_ms = clock_ms
        self._announced: dict[int, int] = {}  # version -> its write's Redis TIME ms
        self._task: asyncio.Task[None] | None = None
        self._again = False
        self._reads_done: deque[tuple[int, int]] = deque(maxlen=MAX_READS_KEPT)  # (version, ms)
        self.reads = 0  # full reads started (tests and the bench count them)
        self.malformed = 0

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
        """A write was announced: read the set unless this node has that very version."""
        version_text, _, written_text = data.decode("ascii", "replace").partition("|")
        try:
            version, written_ms = int(version_text), int(written_text or 0)
        except ValueError:
            self.malformed += 1
            if self.malformed == 1:  # once: a foreign publisher must not flood the log
                log.warning("ignoring a malformed message on the overrides channel: %.60r", data)
            return
        own = self.keeper.snapshot.version
        if version <= own and self._late(version, written_ms):
            return  # a read made after that write has it already
        if version > own and written_ms > 0:
            self._announced[version] = written_ms
            while len(self._announced) > MAX_PENDING:
                del self._announced[min(self._announced)]
        if version != own:  # older and unexplained: Redis lost the set and began again
            self.request()

    def request(self) -> None:
        """Read the set now, or once more after the read under way (bursts coalesce)."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._reads(), name="overrides-read")

    async def stop(self) -> None:
        """Wait for the read under way, if any (at shutdown, before the store closes)."""
        self._again = False
        if self._task is not None:
            await self._task

    async def _reads(self) -> None:
        self._again = True
        while self._again:
            self._again = False
            self.reads += 1
            if await self.keeper.refresh():  # a failure keeps the set; the next trigger retries
                self._applied()

    def _applied(self) -> None:
        """Each announced version now in force took this long from its write to here."""
        version, now_ms = self.keeper.snapshot.version, self._clock_ms()
        self._reads_done.append((version, now_ms))
        for announced in [v for v in self._announced if v <= version]:
            lag_ms = max(0, now_ms - self._announced.pop(announced))
            self.keeper.observe_propagation(lag_ms / 1000)

    def _late(self, version: int, written_ms: int) -> bool:
        """A message for a version not above this node's: if a read made after that write got
        it (a burst's message delivered after the read), its lag ended at that read."""
        applied = [at for got, at in self._reads_done if got >= version and at >= written_ms]
        if applied and written_ms > 0:
            self.keeper.observe_propagation((min(applied) - written_ms) / 1000)
        return bool(applied)


def follow_overrides(
    storage: object,
    keeper: Refreshable,
    clock_ms: Callable[[], int],
    subscriber: Subscriber | None = None,
) -> tuple[Subscriber | None, OverrideFollower | None]:
    """With overrides on Redis: the follower, listening on `subscriber` (the node's; a new one
    if not given, which the caller runs). Else (None, None): nothing is shared."""
    if not isinstance(storage, RedisStorage):
        return subscriber, None
    subscriber = subscriber or Subscriber(storage.client)
    follower = OverrideFollower(keeper, clock_ms)
    follower.attach(subscriber, storage.keys)
    return subscriber, follower

"""The background loop that ends spans: one store round trip per span end, never overlapping."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from ratelimit_sidecar.core import FleetLimiter, SyncBatch, SyncResult, SyncSchedule, SyncStats
from ratelimit_sidecar.core.schedule import DEFAULT_TIMEOUT_MS, FLUSH_ATTEMPTS, POLL_MS
from ratelimit_sidecar.storage.base import Storage
from ratelimit_sidecar.storage.errors import StoreError, StoreTimeout
from ratelimit_sidecar.storage.keys import digest
from ratelimit_sidecar.sync.store_clock import StoreClock

log = logging.getLogger("ratelimit_sidecar.sync")
KEY_LOG_EVERY_MS = 10_000  # while keys keep failing, one warning per this many ms
KEYS_LOGGED = 3  # key digests named in that warning


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class SyncLoop:
    """Runs the core's `SyncSchedule` on the event loop: wakes at the next span end of any
    tracked rule (or heartbeat) and syncs the keys whose span ended.

    The store call has a short timeout (at most half the shortest span), so a slow store turns
    into the core's fallback rather than into late decisions; requests never wait on it.
    """

    def __init__(
        self,
        limiter: FleetLimiter,
        storage: Storage,
        clock_ms: Callable[[], int] = wall_clock_ms,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        on_sync: Callable[[SyncStats, float, str], None] | None = None,
        *,
        store_clock: StoreClock | None = None,
    ) -> None:
        """With `store_clock`, spans follow the store's clock: its `now_ms` replaces
        `clock_ms`, and every answer that reports the store's time corrects its offset."""
        self.limiter = limiter
        self.storage = storage
        self._clock_ms = clock_ms if store_clock is None else store_clock.now_ms
        self._store_clock = store_clock
        self._schedule = SyncSchedule(self._clock_ms(), timeout_ms)
        self._on_sync = on_sync
        self._stop = asyncio.Event()
        self._woken = asyncio.Event()  # an early push (core/quiet_keys.py), or stop
        limiter.early.wake = self._woken.set
        self.store_up = True  # the last sync was answered (even if some keys failed in it)
        self.last_error = ""  # the kind of the last failure ("timeout", "connection", ...)
        self.key_errors = 0  # keys the store answered but did not apply, in the last sync
        self.heartbeat_errors = 0  # heartbeats the store answered with an error (cumulative)
        self.heartbeat_error = ""  # why the last heartbeat failed ("": it did not), for /readyz
        self._key_errors_logged_ms: int | None = None

    def stop(self) -> None:
        self._stop.set()
        self._woken.set()

    async def run(self) -> None:
        schedule = self._schedule
        while not self._stop.is_set():
            now = self._clock_ms()
            due = schedule.next_sync(self.limiter.next_span_end(now))
            if await self._sleep_until(min(due, now + POLL_MS)):
                return
            if self._clock_ms() >= schedule.due_ms:
                await self.sync_once()
                schedule.synced(self._clock_ms())

    async def _sleep_until(self, wake_ms: int) -> bool:
        """Sleep until the clock reaches `wake_ms`, an early push is asked for or the loop is
        stopped (either wakes it); True if stopped. `run` looks at the clock again after."""
        delay = wake_ms - self._clock_ms()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), delay / 1000)
        self._woken.clear()
        return self._stop.is_set()

    async def sync_once(self, flush: bool = False) -> SyncStats:
        started = time.perf_counter()
        for _ in self.limiter.end_span_steps(self._clock_ms(), flush=flush):
            await asyncio.sleep(0)  # let requests in between slices of a large span
        batch = self.limiter.batch_in_flight()
        batch.heartbeat = self._schedule.heartbeat_due(
            self._clock_ms(), self.limiter.shortest_span_ms()
        )
        result, resend = await self._call_store(batch)
        stats = self.limiter.apply_sync(self._clock_ms(), batch, result, resend)
        if result is not None:
            self._report_key_errors(batch, result, stats.failed_keys)
            if batch.heartbeat:
                self._report_heartbeat(result.heartbeat_error)
        else:
            self.key_errors = 0  # no key was answered: the failure is in `last_error`
        if self._on_sync is not None:
            self._on_sync(stats, time.perf_counter() - started, self.last_error)
        return stats

    async def _call_store(self, batch: SyncBatch) -> tuple[SyncResult | None, bool]:
        """The store's answer, or None and whether the batch may be sent again."""
        clock = self._store_clock
        sent = clock.local_ms() if clock is not None else 0
        keys = len(batch.pushes) + len(batch.total_reads)
        timeout_ms = self._schedule.store_timeout_ms(self.limiter.shortest_span_ms(), keys)
        if not batch and not batch.heartbeat:
            return SyncResult(), True  # nothing to push, read or beat: no call at all
        try:
            result = await asyncio.wait_for(self.storage.sync(batch), timeout_ms / 1000)
        except TimeoutError as exc:  # our own deadline: the store may still apply it
            return self._failed(StoreTimeout(f"no answer in {timeout_ms} ms"), exc)
        except StoreError as exc:
            return self._failed(exc, exc)
        except Exception as exc:  # a storage bug: still the fallback, never a dead loop
            log.exception("unexpected error from %s", self.storage.description)
            return self._failed(StoreError(str(exc)), exc)
        if clock is not None and result.store_time_ms:
            clock.observe(sent, clock.local_ms(), result.store_time_ms)
        if not self.store_up:
            log.info("store is back: %s", self.storage.description)
        self.store_up, self.last_error = True, ""
        return result, True

    def _failed(self, error: StoreError, cause: BaseException) -> tuple[None, bool]:
        """Any store failure becomes the fallback, never a crash."""
        if self.store_up:
            log.warning(
                "store sync failed (%s: %s); deciding from local thresholds", error.kind, cause
            )
        self.store_up, self.last_error = False, error.kind
        return None, not error.may_have_applied

    def _report_heartbeat(self, error: str) -> None:
        """A heartbeat the store refused (a wrong-typed node set...): counted, shown on /readyz
        and logged when it starts and ends; the live node count keeps its last value."""
        if error:
            self.heartbeat_errors += 1
            if not self.heartbeat_error:
                log.warning("heartbeat failed: %s; the live node count is not updated", error)
        elif self.heartbeat_error:
            log.info("heartbeat answered again")
        self.heartbeat_error = error

    def _report_key_errors(self, batch: SyncBatch, result: SyncResult, failed: int) -> None:
        """Record the keys the store did not apply; log them at most once per KEY_LOG_EVERY_MS
        (and at once when they start), naming a few by digest, never by descriptor value."""
        previous, self.key_errors = self.key_errors, failed
        now = self._clock_ms()
        if not failed:
            if previous:
                log.info("every key synced again")
            self._key_errors_logged_ms = None
            return
        last = self._key_errors_logged_ms
        if last is not None and now - last < KEY_LOG_EVERY_MS:
            return
        self._key_errors_logged_ms = now
        rows = zip(batch.pushes, result.pushes, strict=True)
        failures = {digest(push.key): answer.error for push, answer in rows if answer.error}
        shown = ", ".join(list(failures)[:KEYS_LOGGED])
        log.warning(
            "store did not apply %d keys (%s%s): %s; their counts are kept for the next sync",
            failed, shown, ", ..." if len(failures) > KEYS_LOGGED else "",
            next(iter(failures.values())),
        )  # fmt: skip

    async def flush(self) -> int:
        """Push everything admitted so far; returns the hits that could not be pushed."""
        for _ in range(FLUSH_ATTEMPTS):
            await self.sync_once(flush=True)
            if self.limiter.pending_hits() == 0:
                return 0
        left = self.limiter.pending_hits()
        log.error("shutdown: %d admitted hits could not be pushed to the store", left)
        return left

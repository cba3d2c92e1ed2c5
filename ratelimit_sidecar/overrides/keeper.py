"""The override keeper: the set of runtime overrides in force on this node.

It holds the store's last snapshot (version and documents), parses each document into its rule
(a document that no longer parses is logged and skipped, never fatal), and gives the handler the
ones not expired (`RateLimitHandler.swap_overrides`). `refresh()` reads the whole set from the
store and applies it when its version changed; `run()` does so every `refresh_s` (a store shared
with other nodes may change under us; a missed change message is repaired by this read) and
re-applies the set when the next override expires, without any call. The store down: the last
set read stays in force.

Hooks for a shared store's change messages (storage/subscriber.py): call `refresh()` when one
arrives, and `observe_propagation(seconds)` with the lag from the write to the set applied.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.overrides.applied import AppliedOverrides
from ratelimit_sidecar.overrides.model import (
    Override,
    OverrideBounds,
    OverrideError,
    parse_override,
)
from ratelimit_sidecar.overrides.redis_store import RedisOverrideStore
from ratelimit_sidecar.overrides.store import Document, OverrideSnapshot, OverrideStore
from ratelimit_sidecar.storage.base import Storage
from ratelimit_sidecar.storage.errors import StoreError
from ratelimit_sidecar.storage.keys import value_digest
from ratelimit_sidecar.storage.redis_store import RedisStorage

log = logging.getLogger("ratelimit_sidecar.overrides")

PARSE_SLICE = 100  # new documents parsed between two yields to the event loop
START_TIMEOUT_S = 2.0  # the first read at start-up; the store down: start with no overrides
EMPTY = OverrideSnapshot(0, {})


@dataclass(frozen=True, slots=True)
class OverrideOptions:
    """How the node keeps its overrides: what one may say (`bounds`), how often the whole set
    is read again, and the directory keeping them without Redis (None: not kept there)."""

    bounds: OverrideBounds
    refresh_s: float
    state_dir: str | None


def override_store(state_dir: str | None, storage: Storage | None) -> OverrideStore | None:
    """Where overrides are kept: the shared store with `--redis-url` (added by the Redis
    override store), else a file under `state_dir` (`--state-dir`, local-only), else none
    (writes answer 409)."""
    if isinstance(storage, RedisStorage):  # beside the counters: same client and prefix
        return RedisOverrideStore.sharing(storage)
    if state_dir:
        from ratelimit_sidecar.overrides.file_store import FileOverrideStore

        return FileOverrideStore(state_dir)
    return None


def keeper_for(
    options: OverrideOptions,
    storage: Storage | None,
    apply: Callable[[AppliedOverrides], None],
    clock_ms: Callable[[], int],
    metrics: Metrics | None,
) -> OverrideKeeper:
    """The node's keeper, on the store `override_store` picks."""
    store = override_store(options.state_dir, storage)
    return OverrideKeeper(
        store, apply, clock_ms, options.bounds, refresh_s=options.refresh_s, metrics=metrics
    )


class OverrideKeeper:
    """Applies the store's override set to the request path, and keeps it current."""

    def __init__(
        self,
        store: OverrideStore | None,
        apply: Callable[[AppliedOverrides], None],
        clock_ms: Callable[[], int],
        bounds: OverrideBounds,
        *,
        refresh_s: float = 10.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.snapshot = EMPTY
        self.in_force: tuple[Override, ...] = ()
        self.store_up = True
        self.last_error = ""
        self._apply_to_handler = apply
        self._clock_ms = clock_ms
        self.bounds = bounds
        self._refresh_s = refresh_s
        self._metrics = metrics
        self._parsed: dict[str, tuple[Document, Override]] = {}  # by id: reused while unchanged
        self._installed = False  # the first read installs even version 0; later, changes only
        self._next_expiry: int | None = None
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._reading = asyncio.Lock()  # a write's, the periodic and the change messages' reads

    async def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """The current set, read before the node answers ready (bounded: the store down, it
        starts with none and the periodic read catches up)."""
        await self.refresh(read_timeout_s=timeout_s)

    async def refresh(self, read_timeout_s: float | None = None) -> bool:
        """Read the whole set; apply it if its version changed. False: the store could not be
        read, the last set stays in force. One at a time (a write's, the periodic one, a change
        message's): a set never replaces a newer one read after it."""
        if self.store is None:
            return True
        async with self._reading:  # one read at a time: an older answer never lands last
            try:
                snapshot = await asyncio.wait_for(self.store.read(), read_timeout_s)
            except (StoreError, TimeoutError) as exc:
                self._failed(str(exc) or type(exc).__name__)
                return False
            self.store_up, self.last_error = True, ""
            if snapshot.version != self.snapshot.version or not self._installed:
                self._install_parsed(snapshot, await self._parse_all(snapshot))
        return True

    async def _parse_all(self, snapshot: OverrideSnapshot) -> dict[str, tuple[Document, Override]]:
        """Every document's override; unchanged ones reused, new ones parsed `PARSE_SLICE` at a
        time between which requests are served (about 0.1 ms each)."""
        parsed: dict[str, tuple[Document, Override]] = {}
        fresh = 0
        for override_id, document in snapshot.documents.items():
            known = self._parsed.get(override_id)
            if known is None or known[0] != document:
                fresh += 1
                if fresh % PARSE_SLICE == 0:
                    await asyncio.sleep(0)
            found = self._parse(override_id, document)
            if found is not None:
                parsed[override_id] = (document, found)
        return parsed

    def _install_parsed(
        self, snapshot: OverrideSnapshot, parsed: dict[str, tuple[Document, Override]]
    ) -> None:
        self.snapshot, self._parsed, self._installed = snapshot, parsed, True
        self.apply_current()
        self._wake.set()

    def apply_current(self) -> None:
        """Give the handler the overrides not expired now, and note when the next expires."""
        now = self._clock_ms()
        in_force = tuple(o for _, o in self._parsed.values() if not o.expired(now))
        self.in_force = in_force
        ends = [o.expires_at_ms for o in in_force if o.expires_at_ms is not None]
        self._next_expiry = min(ends, default=None)
        self._apply_to_handler(AppliedOverrides.of(in_force, self.snapshot.version))
        if self._metrics is not None:
            self._metrics.overrides_in_force.set(len(in_force))
            self._metrics.overrides_version.set(self.snapshot.version)

    def observe_propagation(self, seconds: float) -> None:
        """The lag from a write (its time known to the caller) to its set applied here."""
        if self._metrics is not None:
            self._metrics.overrides_propagation_seconds.observe(max(0.0, seconds))

    async def run(self) -> None:
        """Until `stop`: a full read every `refresh_s`, and the set re-applied at each expiry."""
        loop = asyncio.get_running_loop()
        next_read = loop.time() + self._refresh_s
        while not self._stop.is_set():
            self._wake.clear()
            delay = next_read - loop.time()
            if self._next_expiry is not None:
                delay = min(delay, (self._next_expiry - self._clock_ms()) / 1000)
            await _wait_any((self._stop, self._wake), max(0.0, delay))
            if self._stop.is_set():
                return
            if self._next_expiry is not None and self._clock_ms() >= self._next_expiry:
                self.apply_current()
            if loop.time() >= next_read:
                await self._refresh_surviving()
                next_read = loop.time() + self._refresh_s

    async def _refresh_surviving(self) -> None:
        """The periodic read: whatever goes wrong is logged, and the loop goes on (a dead loop
        would leave every later change and expiry unapplied on this node)."""
        try:
            await self.refresh()
        except Exception:
            log.exception("override refresh failed; next attempt in %.1f s", self._refresh_s)

    def stop(self) -> None:
        self._stop.set()

    async def close(self) -> None:
        self.stop()
        if self.store is not None:
            await self.store.close()

    def view(self, show_values: bool) -> dict[str, object]:
        """/debug/rules' part: the version and the overrides in force (values as digests
        unless `show_values`: they are often API keys)."""
        shown = []
        for override in self.in_force:
            document = dict(override.document)
            if not show_values:
                document["descriptor"] = [
                    {"key": key, "value": value_digest(value)} for key, value in override.entries
                ]
            shown.append(document)
        return {"version": self.snapshot.version, "in_force": shown, "store_up": self.store_up}

    def _parse(self, override_id: str, document: Document) -> Override | None:
        known = self._parsed.get(override_id)
        if known is not None and known[0] == document:
            return known[1]
        body = {key: value for key, value in document.items() if key != "id"}
        try:
            override = parse_override(body, self.bounds)
        except OverrideError as exc:
            log.warning("override %s skipped: %s", override_id, exc)
            return None
        if override.id != override_id:
            log.warning("override %s skipped: its domain and descriptor name %s", override_id,
                        override.id)  # fmt: skip
            return None
        return override

    def _failed(self, reason: str) -> None:
        if self.store_up:
            log.warning("override store unreadable, keeping %d overrides: %s",
                        len(self.in_force), reason)  # fmt: skip
        self.store_up, self.last_error = False, reason


async def _wait_any(events: tuple[asyncio.Event, ...], timeout_s: float) -> None:
    """Until one of `events` is set or `timeout_s` passes."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def documents_by_domain(
    documents: Mapping[str, Document], domain: str | None
) -> list[Mapping[str, object]]:
    """The documents, sorted by id, of `domain` only if given (the API's list)."""
    return [
        documents[i]
        for i in sorted(documents)
        if domain is None or documents[i].get("domain") == domain
    ]

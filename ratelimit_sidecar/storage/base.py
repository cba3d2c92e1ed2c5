"""The storage protocol: one call per span end, answered in one round trip per store node."""

from __future__ import annotations

from typing import Protocol

from ratelimit_sidecar.core.types import SyncBatch, SyncResult


class Storage(Protocol):
    """A shared counter store.

    `sync` applies a batch of INCRBYs (setting the shared block flag when a total crosses its
    limit), reads block flags and finished-window totals, refreshes this node's heartbeat, and
    answers with a `SyncResult` whose lists line up with the batch. It raises on any failure;
    the caller turns that into the core's fallback.
    """

    @property
    def description(self) -> str:
        """Topology for logs, without secrets: e.g. `redis://127.0.0.1:6379/0`."""
        ...

    async def sync(self, batch: SyncBatch) -> SyncResult: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...

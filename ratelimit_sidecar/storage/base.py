"""The storage protocol: one call per span end, answered in one round trip per store node."""

from __future__ import annotations

from typing import Protocol

from ratelimit_sidecar.core.types import SyncBatch, SyncResult


class Storage(Protocol):
    """`sync` applies each push (storage/shared_rules.py) and answers a `SyncResult` lined up
    with the batch: a push not applied with `error` (surely not counted), an unreadable total,
    clock or node count 0. A sync failed whole raises a `StoreError`."""

    @property
    def description(self) -> str:
        """Without secrets, e.g. `redis://127.0.0.1:6379/0`."""
        ...

    async def sync(self, batch: SyncBatch) -> SyncResult: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...

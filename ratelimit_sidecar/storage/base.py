"""The storage protocol: one call per span end, answered in one round trip per store node."""

from __future__ import annotations

from typing import Protocol

from ratelimit_sidecar.core.types import SyncBatch, SyncResult


class Storage(Protocol):
    """`sync` applies each push by its limit's algorithm (storage/shared_rules.py), sets and
    answers the shared block flag, reads finished-window totals, refreshes this node's heartbeat,
    and answers a `SyncResult` lined up with the batch. A push not applied is answered with
    `error` (surely not counted); an unreadable total, clock or node count is 0. A sync failed as
    a whole raises a `StoreError` whose `may_have_applied` says whether resending could count
    twice."""

    @property
    def description(self) -> str:
        """Without secrets, e.g. `redis://127.0.0.1:6379/0`."""
        ...

    async def sync(self, batch: SyncBatch) -> SyncResult: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...

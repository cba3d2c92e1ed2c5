"""The storage protocol: one call per span end, answered in one round trip per store node."""

from __future__ import annotations

from typing import Protocol

from ratelimit_sidecar.core.types import SyncBatch, SyncResult


class Storage(Protocol):
    """A shared counter store.

    `sync` applies a batch of pushes, each by its limit's algorithm (storage/shared_rules.py: a
    fixed window's counter, a sliding window's span counter answered with the window of span
    totals, a token bucket's TAT answered with its debt in ms; every push also counts its
    window), sets the shared block flag when an answer crosses its limit and answers the flag's
    remaining time, reads finished-window totals, refreshes this node's heartbeat, and answers
    with a `SyncResult` whose lists line up with the batch. A push the store could not apply is
    answered with its `error` set (and was surely not counted); a total, clock or node count it
    could not read is answered 0 (unknown). A sync that failed as a whole raises a `StoreError`
    (storage/errors.py), whose `may_have_applied` tells the caller whether resending the counts
    could count them twice: `StoreUnavailable` (could not connect: nothing ran), `StoreTimeout`
    and `StoreLost` (no answer, or the connection broke, after sending: it may have run),
    `StoreRefused` (refused before sending) or `StoreUnreadable` (an answer that does not
    parse). The caller turns any failure into the core's fallback.
    """

    @property
    def description(self) -> str:
        """Topology for logs, without secrets: e.g. `redis://127.0.0.1:6379/0`."""
        ...

    async def sync(self, batch: SyncBatch) -> SyncResult: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...

"""Where span deltas go: the store protocol, its failures and its Redis backend (the in-memory
reference store is the simulator's: simulator/memory_store.py)."""

from __future__ import annotations

from ratelimit_sidecar.storage.base import Storage
from ratelimit_sidecar.storage.errors import (
    StoreError,
    StoreLost,
    StoreRefused,
    StoreTimeout,
    StoreUnavailable,
    StoreUnreadable,
)

__all__ = [
    "Storage",
    "StoreError",
    "StoreLost",
    "StoreRefused",
    "StoreTimeout",
    "StoreUnavailable",
    "StoreUnreadable",
]

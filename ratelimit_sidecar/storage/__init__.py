"""Where span deltas go: the store protocol, its failures and its backends (memory, Redis)."""

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
from ratelimit_sidecar.storage.memory import MemoryStorage

__all__ = [
    "MemoryStorage",
    "Storage",
    "StoreError",
    "StoreLost",
    "StoreRefused",
    "StoreTimeout",
    "StoreUnavailable",
    "StoreUnreadable",
]

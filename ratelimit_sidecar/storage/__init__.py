"""Where span deltas go: the store protocol and its backends (memory, Redis)."""

from __future__ import annotations

from ratelimit_sidecar.storage.base import Storage
from ratelimit_sidecar.storage.memory import MemoryStorage

__all__ = ["MemoryStorage", "Storage"]

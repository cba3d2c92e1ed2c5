"""The limiter core: pure, synchronous, clock passed in. Imports no grpc, redis, asyncio or time."""

from __future__ import annotations

from ratelimit_sidecar.core.limiter import DEFAULT_MAX_KEYS, Limiter, unlimited_verdict
from ratelimit_sidecar.core.types import (
    Code,
    Decision,
    Hit,
    KeyId,
    Push,
    PushResult,
    SyncBatch,
    SyncResult,
    SyncStats,
    TotalRead,
    Verdict,
)

__all__ = [
    "DEFAULT_MAX_KEYS",
    "Code",
    "Decision",
    "Hit",
    "KeyId",
    "Limiter",
    "Push",
    "PushResult",
    "SyncBatch",
    "SyncResult",
    "SyncStats",
    "TotalRead",
    "Verdict",
    "unlimited_verdict",
]

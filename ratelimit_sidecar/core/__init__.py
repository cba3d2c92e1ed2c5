"""The limiter core: pure, synchronous, clock passed in. Imports no grpc, redis, asyncio or time."""

from __future__ import annotations

from ratelimit_sidecar.core.fixed_window import FixedWindow
from ratelimit_sidecar.core.fleet import FleetLimiter
from ratelimit_sidecar.core.limiter import DEFAULT_MAX_KEYS, Limiter
from ratelimit_sidecar.core.local import LocalLimiter
from ratelimit_sidecar.core.schedule import SyncSchedule
from ratelimit_sidecar.core.types import (
    Code,
    Decision,
    Hit,
    KeyId,
    PushResult,
    SyncBatch,
    SyncResult,
    SyncStats,
    TotalRead,
    Verdict,
)
from ratelimit_sidecar.core.verdicts import unlimited_verdict

__all__ = [
    "DEFAULT_MAX_KEYS",
    "Code",
    "Decision",
    "FixedWindow",
    "FleetLimiter",
    "Hit",
    "KeyId",
    "Limiter",
    "LocalLimiter",
    "PushResult",
    "SyncBatch",
    "SyncResult",
    "SyncSchedule",
    "SyncStats",
    "TotalRead",
    "Verdict",
    "unlimited_verdict",
]

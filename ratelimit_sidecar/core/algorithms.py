"""Every decision rule the limiter can run, indexed by `AlgorithmName`."""

from __future__ import annotations

from ratelimit_sidecar.config.model import AlgorithmName
from ratelimit_sidecar.core.algorithm import Algorithm
from ratelimit_sidecar.core.fixed_window import FixedWindow
from ratelimit_sidecar.core.sliding_log import SlidingLog
from ratelimit_sidecar.core.sliding_window import SlidingWindow
from ratelimit_sidecar.core.token_bucket import TokenBucket


def algorithms_with(fixed_window: Algorithm | None = None) -> tuple[Algorithm, ...]:
    """One instance of each algorithm, in `AlgorithmName` order; `fixed_window` replaces the
    default fixed window (the simulator's variants are its parameters)."""
    chosen: dict[AlgorithmName, Algorithm] = {
        AlgorithmName.FIXED_WINDOW: fixed_window or FixedWindow(),
        AlgorithmName.SLIDING_WINDOW: SlidingWindow(),
        AlgorithmName.TOKEN_BUCKET: TokenBucket(),
        AlgorithmName.SLIDING_LOG: SlidingLog(),
    }
    return tuple(chosen[name] for name in AlgorithmName)

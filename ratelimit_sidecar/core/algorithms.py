"""Every decision rule the limiter can run, indexed by `AlgorithmName`."""

from __future__ import annotations

from ratelimit_sidecar.config.model import AlgorithmName
from ratelimit_sidecar.core.algorithm import Algorithm, SharedAlgorithm
from ratelimit_sidecar.core.fixed_window import FixedWindow
from ratelimit_sidecar.core.sliding_log import SlidingLog
from ratelimit_sidecar.core.sliding_window import SlidingWindow
from ratelimit_sidecar.core.token_bucket import TokenBucket


def shared_algorithms(
    fixed_window: FixedWindow | None = None,
) -> tuple[SharedAlgorithm | None, ...]:
    """In `AlgorithmName` order (None: the sliding log); `fixed_window`: a simulator variant."""
    chosen: dict[AlgorithmName, SharedAlgorithm | None] = {
        AlgorithmName.FIXED_WINDOW: fixed_window or FixedWindow(),
        AlgorithmName.SLIDING_WINDOW: SlidingWindow(),
        AlgorithmName.TOKEN_BUCKET: TokenBucket(),
        AlgorithmName.SLIDING_LOG: None,
    }
    return tuple(chosen[name] for name in AlgorithmName)


def all_algorithms(fixed_window: FixedWindow | None = None) -> tuple[Algorithm, ...]:
    shared = shared_algorithms(fixed_window)
    log = AlgorithmName.SLIDING_LOG
    return tuple(SlidingLog() if name is log else shared[name] for name in AlgorithmName)  # type: ignore[misc]

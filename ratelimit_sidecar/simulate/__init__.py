"""Accuracy simulator: the real limiter core and sync logic under a virtual clock.

`ratelimit-sidecar simulate --help` for the command line; `run_scenario` for code. Imports no
grpc, redis or asyncio: everything runs synchronously in one process, deterministically for a
seed.
"""

from __future__ import annotations

from ratelimit_sidecar.simulate.params import SimParams
from ratelimit_sidecar.simulate.runner import Run, run_scenario, run_system

__all__ = ["Run", "SimParams", "run_scenario", "run_system"]

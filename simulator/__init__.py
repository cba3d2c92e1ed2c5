"""Accuracy simulator: the real limiter core and sync logic under a virtual clock.

`python -m simulator --help` (or `ratelimit-sidecar simulate` in a checkout) for the command
line; `run_scenario` for code. Imports no grpc, redis or asyncio: everything runs synchronously
in one process, deterministically for a seed. Not part of the wheel.
"""

from __future__ import annotations

from simulator.params import SimParams
from simulator.runner import Run, run_scenario, run_system

__all__ = ["Run", "SimParams", "run_scenario", "run_system"]

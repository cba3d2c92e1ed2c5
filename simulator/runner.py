"""Run systems on a scenario, over one or several seeds, and time them (CPU seconds)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from simulator.engine import Engine
from simulator.metrics import Recorder, Summary, summarize
from simulator.params import SimParams
from simulator.scenarios import Setup, resolve
from simulator.variants import system_for


@dataclass(frozen=True)
class Run:
    """One system on one scenario: the numbers, and the first seed's series for plots."""

    setup: Setup
    summary: Summary
    recorder: Recorder


def run_system(setup: Setup, system: str, repeat: int = 1) -> Run:
    """`repeat` seeds from the setup's seed on; the summary pools them, CPU is per seed."""
    spec = system_for(system)
    recorders, cpu = [], 0.0
    for k in range(repeat):
        seeded = setup if k == 0 else reseed(setup, setup.params.seed + k)
        started = time.process_time()
        recorders.append(Engine(seeded, spec).run())
        cpu = max(cpu, time.process_time() - started)
    summary = summarize(recorders, setup.name, system, spec.shared and not spec.central)
    return Run(setup, replace(summary, cpu_s=round(cpu, 3)), recorders[0])


def reseed(setup: Setup, seed: int) -> Setup:
    return resolve(replace(setup.params, seed=seed))


def run_scenario(
    params: SimParams, systems: Sequence[str] = ("core",), repeat: int = 1
) -> list[Run]:
    """Every system on the same offered traffic (same seeds, same arrivals)."""
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    setup = resolve(params)
    return [run_system(setup, name, repeat) for name in systems]

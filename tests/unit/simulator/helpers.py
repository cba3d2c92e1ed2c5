"""Shared helpers: run the simulator directly and look inside the engine afterwards."""

from __future__ import annotations

from simulator.engine import Engine
from simulator.metrics import Recorder
from simulator.params import SimParams
from simulator.scenarios import Setup, resolve
from simulator.variants import system_for


def engine(system: str = "core", **params: object) -> tuple[Engine, Setup]:
    setup = resolve(SimParams(**params))  # type: ignore[arg-type]
    return Engine(setup, system_for(system)), setup


def run(system: str = "core", **params: object) -> tuple[Recorder, Setup]:
    eng, setup = engine(system, **params)
    return eng.run(), setup


def rejections(system: str = "core", **params: object) -> tuple[list[tuple[int, int]], Setup]:
    """(true time, node) of every rejected request."""
    eng, setup = engine(system, **params)
    seen: list[tuple[int, int]] = []
    record = eng.recorder.request

    def spy(t: int, node: int, ok: bool) -> None:
        if not ok:
            seen.append((t, node))
        record(t, node, ok)

    eng.recorder.request = spy  # type: ignore[method-assign]
    eng.run()
    return seen, setup

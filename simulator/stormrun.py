"""`simulate --scenario retry_storm`: the storm without penalties, and with `--penalty` too,
as one table (stormstats.py) and an optional plot (per window: what the fleet answered, what
each kind of client got)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from simulator.params import SimParams, StormParams, penalty_text
from simulator.storm import run_storm
from simulator.stormstats import StormRecorder, StormSummary, render_storm

WIDTH_PX, HEIGHT_PX, DPI = 900, 520, 80


def storm_report(
    params: SimParams, storm: StormParams, repeat: int, fmt: str, plot: str | None
) -> str:
    """Without penalties, then with `params.penalty` if set: the same clients and seeds."""
    variants = [replace(params, penalty=None)]
    if params.penalty is not None:
        variants.append(params)
    runs = [run_storm(p, storm, repeat=repeat) for p in variants]
    if plot:
        plot_storm([(p, recorder) for p, (_, recorder) in zip(variants, runs, strict=True)], plot)
    summaries: list[StormSummary] = [summary for summary, _ in runs]
    return render_storm(summaries, fmt)


def plot_storm(runs: list[tuple[SimParams, StormRecorder]], path: str) -> None:
    """Two panels over the windows of the first seed: requests the fleet answered; admitted
    per client over MAX, obedient and hammering, for each penalty setting."""
    from simulator.plot import pyplot

    plt = pyplot()
    fig, (top, bottom) = plt.subplots(
        2, 1, sharex=True, figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI
    )
    for params, recorder in runs:
        _panels(top, bottom, params, recorder)
    first = runs[0][1]
    bottom.axhline(1.0, color="black", linestyle=":", label="MAX per client")
    top.set_ylabel("requests answered / window")
    bottom.set_ylabel("admitted / client / MAX")
    bottom.set_xlabel("window")
    top.set_title(
        f"retry_storm: {first.clients[0]} obedient + {first.clients[1]} hammering clients, "
        f"MAX {first.max} per {first.window_ms / 1000:g} s each",
        fontsize=10,
    )
    top.legend(loc="upper right", fontsize=8)
    bottom.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _panels(top: Any, bottom: Any, params: SimParams, recorder: StormRecorder) -> None:
    label = penalty_text(params.penalty)
    style = "-" if params.penalty is None else "--"
    x = list(range(len(recorder.answered[0])))
    answered = [a + b for a, b in zip(*recorder.answered, strict=True)]
    top.step(x, answered, where="post", linestyle=style, label=f"fleet, penalty {label}")
    for kind, name in ((0, "obedient"), (1, "hammering")):
        count = max(1, recorder.clients[kind])
        per_client = [a / count / recorder.max for a in recorder.admitted[kind]]
        bottom.step(x, per_client, where="post", linestyle=style, label=f"{name}, {label}")

"""`--plot FILE.png`: offered vs admitted per span, with the spans that rejected shaded.

matplotlib is an optional extra (`pip install 'ratelimit-sidecar[plot]'`), imported only here
and only when a plot is asked for, so the simulator runs without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from simulator.runner import Run

WIDTH_PX, HEIGHT_PX, DPI = 900, 400, 80


class PlotUnavailable(RuntimeError):
    pass


def pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install 'ratelimit-sidecar[plot]'"
        ) from exc
    return plt


def plot_runs(runs: Sequence[Run], path: str, first_window: int = 0, windows: int = 20) -> None:
    """One figure for one scenario: every run's admitted line over the shared offered line;
    shading (from the first run) marks spans with rejections, darker when more rejected."""
    plt = pyplot()
    setup = runs[0].setup
    p = setup.params
    lo = first_window * p.spans
    hi = min(lo + windows * p.spans, p.windows * p.spans)
    x = [i / p.spans for i in range(lo, hi)]
    fig, ax = plt.subplots(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI)
    offered = runs[0].recorder.offered_span[lo:hi]
    ax.step(x, offered, where="post", color="0.55", label="offered")
    for run in runs:
        ax.step(x, run.recorder.admitted_span[lo:hi], where="post", label=run.summary.system)
    _shade(ax, x, offered, runs[0].recorder.admitted_span[lo:hi], 1 / p.spans)
    _outages(ax, runs[0], x)
    ax.axhline(p.max / p.spans, color="black", linestyle=":", label="MAX / spans")
    ax.set_xlabel("window")
    ax.set_ylabel("requests per span")
    ax.set_title(f"{setup.name}: {_subtitle(runs[0])}", fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _shade(ax: Any, x: list[float], offered: list[int], admitted: list[int], width: float) -> None:
    for xi, off, adm in zip(x, offered, admitted, strict=True):
        if off > adm:
            ax.axvspan(xi, xi + width, color="tab:red", alpha=0.08 + 0.27 * (off - adm) / off, lw=0)


def _outages(ax: Any, run: Run, x: list[float]) -> None:
    setup = run.setup
    for a, b in setup.outages:
        start = (a - setup.start_ms) / setup.params.window_ms
        end = (b - setup.start_ms) / setup.params.window_ms
        if x and end > x[0] and start < x[-1]:
            ax.axvspan(max(start, x[0]), min(end, x[-1]), color="0.2", alpha=0.08, lw=0)
            ax.text(max(start, x[0]), 0, " store down", fontsize=8, va="bottom")


def _subtitle(run: Run) -> str:
    p = run.setup.params
    return (
        f"{len(run.setup.membership.weights)} nodes, MAX {p.max} per {p.window_ms / 1000:g} s, "
        f"{p.spans} spans, cooldown {p.cooldown / 1000:g} s, {run.setup.rate_per_s:g} req/s "
        "(red: spans with rejections)"
    )

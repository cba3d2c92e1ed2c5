"""`python -m simulator.new_keys`: a new key's first windows under the two rules a node can
start it with, on the real core and sync schedule (simulator/engine.py).

"alone" (the shipped rule, system `core`): a new key assumes its client uses this gateway
only, pushes early once past an even share of what is left, and learns its share from the
answers. "even split" (system `even-split`, the rule before): each own hit stands for every
live node until the first sync. Traffic starts on a key no node has seen: on one gateway, on
all of them evenly, or skewed 60/30/10; steady Poisson traffic at 0.8x and 2x the limit, and
bursts across a window boundary (90 % of 2x the limit in one span).
"""

from __future__ import annotations

import sys
from dataclasses import replace

from simulator.params import SimParams
from simulator.runner import run_scenario

SHAPES = {
    "one gateway": (1.0, 1e-6, 1e-6),  # the others see (almost) nothing
    "all gateways": None,
    "skewed 60/30/10": (6.0, 3.0, 1.0),
}
TRAFFIC = (("steady", 0.8, 1), ("steady", 2.0, 1), ("boundary", None, 2))
SYSTEMS = {"core": "alone", "even-split": "even split", "edge": "edge (alone, then its total)"}
SEEDS = 10


def rows(seeds: int = SEEDS) -> list[tuple[str, str, str, int, int, float]]:
    """(shape, traffic, rule, worst window admitted, MAX, false rejections %) per case."""
    table = []
    for shape, weights in SHAPES.items():
        for scenario, load, windows in TRAFFIC:
            params = replace(
                SimParams(), nodes=3, windows=windows, scenario=scenario, load=load, weights=weights
            )
            traffic = f"{load}x" if load is not None else "boundary burst"
            for run in run_scenario(params, tuple(SYSTEMS), repeat=seeds):
                s = run.summary
                rule = SYSTEMS[s.system]
                table.append((shape, traffic, rule, s.admitted_max, s.max, s.false_rejection_pct))
    return table


def render(table: list[tuple[str, str, str, int, int, float]]) -> str:
    lines = [
        "| traffic on a new key | load | rule | worst window (admitted / MAX) | false rejections |",
        "|---|---|---|---|---|",
    ]
    for shape, traffic, rule, worst, limit, false_pct in table:
        ratio = f"{worst} / {limit} ({worst / limit:.2f}x)"
        lines.append(f"| {shape} | {traffic} | {rule} | {ratio} | {false_pct:.1f} % |")
    return "\n".join(lines)


def main() -> int:
    print(render(rows()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

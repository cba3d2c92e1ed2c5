"""`python -m simulator scale`: the scale model's table and plot (docs/SCALE.md).

Calibrates against a real Redis on this machine first (or reuses the calibration of an earlier
results file), runs the model for each fleet size, prints the tables and writes the results
(calibration included) as JSON, and the plot if asked.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from simulator.scale import SHARD_BUDGET, Case, per_request_load, sidecar_load, summary

DESIGNS = ("sidecar", "per-request")
CALIBRATED = (
    *("request", "incrby", "expire"),
    *("entry_under", "entry_over", "entry_read", "get", "script_call", "heartbeat"),
)


def build_parser() -> argparse.ArgumentParser:
    d = Case(0)
    ap = argparse.ArgumentParser(prog="python -m simulator scale", description=__doc__)
    ap.add_argument("--gateways", default="10,100,1000", help="fleet sizes (%(default)s)")
    ap.add_argument("--keys", type=int, default=d.keys_per_gateway, help="active keys/gateway")
    ap.add_argument("--rate", type=float, default=d.rate_per_gateway, help="requests/s/gateway")
    ap.add_argument("--zipf", type=float, default=d.zipf, help="Zipf exponent of key traffic")
    ap.add_argument("--limit", type=int, default=d.limit, help="requests per key and window")
    ap.add_argument("--window-s", type=int, default=d.window_ms // 1000)
    ap.add_argument("--spans", type=int, default=d.spans)
    ap.add_argument("--calibration", type=Path, help="reuse this results file's calibration")
    ap.add_argument("--results", type=Path, default=Path("bench/results/scale.json"))
    ap.add_argument("--plot", metavar="FILE.png", help="e.g. docs/scale-model.png")
    ap.add_argument("--format", choices=("table", "markdown"), default="table")
    return ap


def run_model(cases: Sequence[Case], costs: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "case": asdict(case),
            "sidecar": summary(sidecar_load(case), costs),
            "per-request": summary(per_request_load(case), costs),
        }
        for case in cases
    ]


def table(header: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> str:
    if markdown:
        lines = [header, ["---"] * len(header), *rows]
        return "\n".join("| " + " | ".join(r) + " |" for r in lines)
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in lines)


def model_table(results: list[dict[str, Any]], markdown: bool) -> str:
    header = ["gateways", "design", "commands/s (sent)", "Redis cores", "shards", "MB/s"]
    header += ["over-admitted", "refused under limit"]
    rows = []
    for result in results:
        for design in DESIGNS:
            s, offered = result[design], result[design]["offered_per_s"]
            rows.append([
                f"{result['case']['gateways']:,}",
                design,
                f"{s['commands_per_s']:,.0f} ({s['client_commands_per_s']:,.0f})",
                f"{s['redis_cores']:.2f}",
                str(s["shards"]),
                f"{s['bytes_per_s'] / 1e6:.1f}",
                f"{s['over_admitted_per_s'] / offered:.3%}",
                f"{s['refused_under_per_s'] / offered:.3%}",
            ])  # fmt: skip
    return table(header, rows, markdown)


def calibration_table(costs: dict[str, Any], markdown: bool) -> str:
    header = ["work", "Redis CPU µs", "commands (all)", "sent", "bytes in", "bytes out"]
    figures: tuple[tuple[str, int], ...] = (("cpu_us", 2), ("commands", 2), ("client_commands", 3))
    figures += (("bytes_in", 0), ("bytes_out", 0))
    rows = [[kind, *(f"{costs[kind][f]:.{d}f}" for f, d in figures)] for kind in CALIBRATED]
    return table(header, rows, markdown)


def plot(results: list[dict[str, Any]], path: str) -> None:
    from simulator.plot import pyplot

    plt = pyplot()
    gateways = [r["case"]["gateways"] for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=80)
    for design, style in zip(DESIGNS, ("o-", "s--"), strict=True):
        axes[0].plot(gateways, [r[design]["redis_cores"] for r in results], style, label=design)
        axes[1].plot(gateways, [r[design]["commands_per_s"] for r in results], style, label=design)
    axes[0].axhline(SHARD_BUDGET, color="0.5", linestyle=":", label="one shard's budget")
    axes[0].set_ylabel("Redis CPU (cores)")
    axes[1].set_ylabel("Redis commands/s (inside scripts too)")
    case = results[0]["case"]
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("gateways")
        ax.legend(fontsize=8)
    fig.suptitle(
        f"{case['keys_per_gateway']:,} active keys and {case['rate_per_gateway']:,.0f} req/s"
        f" per gateway, Zipf {case['zipf']}, limit {case['limit']} per"
        f" {case['window_ms'] // 1000} s in {case['spans']} spans",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    cases = [
        Case(int(n), args.keys, args.rate, args.zipf, args.limit, args.window_s * 1000, args.spans)
        for n in args.gateways.split(",")
    ]
    if args.calibration:
        costs = json.loads(args.calibration.read_text())["calibration"]
    else:
        from simulator.scale_calibrate import calibrate

        costs = calibrate()
    try:
        results = run_model(cases, costs)
    except ValueError as exc:
        print(f"python -m simulator scale: error: {exc}", file=sys.stderr)
        return 2
    markdown = args.format == "markdown"
    print(model_table(results, markdown), end="\n\n")
    print(f"per shard: {SHARD_BUDGET:.0%} of a core; calibration ({costs['redis']['version']}):")
    print(calibration_table(costs, markdown))
    args.results.parent.mkdir(parents=True, exist_ok=True)
    document = {"generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "calibration": costs}
    args.results.write_text(json.dumps({**document, "results": results}, indent=2) + "\n")
    print(f"results: {args.results}", file=sys.stderr)
    if args.plot:
        plot(results, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0

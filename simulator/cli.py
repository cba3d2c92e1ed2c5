"""`python -m simulator` (or `ratelimit-sidecar simulate` in a checkout): run scenarios against
the real core and print what happened."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ratelimit_sidecar.config.model import AlgorithmName
from simulator.metrics import Summary
from simulator.params import (
    SimParams,
    StormParams,
    parse_duration_ms,
    parse_penalty,
)
from simulator.report import render
from simulator.runner import Run, run_scenario
from simulator.scenarios import SCENARIOS
from simulator.storm import SCENARIO as STORM
from simulator.variants import BASELINES, SYSTEMS, VARIANTS, system_for

ALGORITHMS = [name.text for name in AlgorithmName]
EPILOG = "Definitions of every column: docs/ACCURACY.md. Times: 10, 10s, 1.5s, 500ms, 2m."


def build_parser() -> argparse.ArgumentParser:
    d = SimParams()
    ap = argparse.ArgumentParser(
        prog="ratelimit-sidecar simulate", description=__doc__, epilog=EPILOG
    )
    names = ", ".join([*SCENARIOS, STORM])
    ap.add_argument("--scenario", default="all", help=f"all, or some of: {names}")
    ap.add_argument("--algorithm", choices=(*ALGORITHMS, "all"), help="per-rule view (see docs)")
    ap.add_argument("--burst", type=int, default=0, help="token bucket capacity (0: MAX)")
    ap.add_argument("--nodes", type=int, default=d.nodes, help="sidecars (default %(default)s)")
    ap.add_argument("--rate", type=float, help="offered requests/s in total (default: --load)")
    ap.add_argument("--load", type=float, help="offered / limit (default: per scenario)")
    ap.add_argument("--max", type=int, default=d.max, help="requests per window (MAX)")
    ap.add_argument("--window", type=parse_duration_ms, default=d.window_ms, help="window (10s)")
    ap.add_argument("--spans", type=int, default=d.spans, help="spans per window (N)")
    ap.add_argument("--cooldown", type=parse_duration_ms, default=0, help="default: one window")
    ap.add_argument("--skew-ms", type=int, help="node clocks spread over +-this")
    ap.add_argument("--latency-ms", type=int, help="store round trip")
    ap.add_argument("--timeout-ms", type=int, default=d.timeout_ms, help="sync timeout")
    ap.add_argument("--outage", type=_outage, help="START:END seconds after the start")
    ap.add_argument("--rlqs-outage", type=_outage, help="START:END: RLQS server unreachable")
    ap.add_argument("--rlqs-gateways", type=int, help="rlqs systems: gateways on RLQS (first N)")
    ap.add_argument("--weights", type=_weights, help="load balancer shares, e.g. 60,30,10")
    ap.add_argument("--node-ttl-ms", type=int, help="heartbeat TTL (0: no heartbeats)")
    ap.add_argument("--windows", type=int, default=d.windows, help="windows to simulate")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--repeat", type=int, default=1, help="pool this many seeds from --seed")
    ap.add_argument("--systems", default=",".join(BASELINES), help="comma list; + combines")
    ap.add_argument("--variants", action="store_true", help="also run every variant")
    ap.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    ap.add_argument("--plot", metavar="FILE.png", help="offered vs admitted per span")
    ap.add_argument("--plot-from", type=int, default=0, help="first window plotted")
    ap.add_argument("--plot-windows", type=int, default=20, help="windows plotted")
    ap.add_argument("--penalty", type=_penalty, help="FACTOR,MAX,FORGIVE_AFTER, e.g. 2,80s,60s")
    ap.add_argument("--clients", type=_clients, help=f"{STORM}: OBEDIENT,HAMMERING (16,4)")
    ap.add_argument("--client-load", type=float, help=f"{STORM}: each client's load (1.5)")
    ap.add_argument("--list", action="store_true", help="list scenarios and systems, then exit")
    return ap


def _outage(text: str) -> tuple[int, int]:
    start, sep, end = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError("expected START:END in seconds, e.g. 300:500")
    a, b = round(float(start) * 1000), round(float(end) * 1000)
    if not 0 <= a < b:
        raise argparse.ArgumentTypeError("need 0 <= START < END")
    return a, b


def _weights(text: str) -> tuple[float, ...]:
    values = tuple(float(v) for v in text.split(","))
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("weights must be positive numbers, e.g. 60,30,10")
    return values


def _penalty(text: str) -> object:
    try:
        return parse_penalty(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _clients(text: str) -> tuple[int, int]:
    obedient, sep, hammering = text.partition(",")
    if not sep or not (obedient.isdigit() and hammering.isdigit()):
        raise argparse.ArgumentTypeError("expected OBEDIENT,HAMMERING, e.g. 16,4")
    return int(obedient), int(hammering)


def _storm(args: argparse.Namespace) -> StormParams:
    storm = StormParams()
    if args.clients is not None:
        storm = replace(storm, obedient=args.clients[0], hammering=args.clients[1])
    if args.client_load is not None:
        storm = replace(storm, client_load=args.client_load)
    return storm


def _params(args: argparse.Namespace) -> SimParams:
    return SimParams(
        nodes=args.nodes,
        max=args.max,
        window_ms=args.window,
        spans=args.spans,
        cooldown_ms=args.cooldown,
        windows=args.windows,
        seed=args.seed,
        rate=args.rate,
        load=args.load,
        skew_ms=args.skew_ms,
        latency_ms=args.latency_ms,
        outage=args.outage,
        weights=args.weights,
        timeout_ms=args.timeout_ms,
        node_ttl_ms=args.node_ttl_ms,
        burst=args.burst,
        rlqs_gateways=args.rlqs_gateways,
        rlqs_outage=args.rlqs_outage,
        penalty=args.penalty,
    )


def _algorithms(args: argparse.Namespace) -> list[AlgorithmName]:
    if args.algorithm in {None, "fixed_window"}:
        return [AlgorithmName.FIXED_WINDOW]
    if args.algorithm == "all":
        return list(AlgorithmName)
    return [AlgorithmName[args.algorithm.upper()]]


def _runnable(algorithm: AlgorithmName, systems: list[str]) -> list[str]:
    """A sliding log cannot be summed in a store (a fleet runs it as a sliding window):
    only the local-only baseline and the exact reference run it."""
    if algorithm is not AlgorithmName.SLIDING_LOG:
        return systems
    kept = [name for name in systems if name in {"local", "exact"}]
    if kept != systems:
        print(
            "sliding_log: fleet systems skipped (a fleet runs it as sliding_window)",
            file=sys.stderr,
        )
    if not kept:
        raise ValueError("sliding_log runs only as local and exact (--systems local,exact)")
    return kept


def _systems(args: argparse.Namespace) -> list[str]:
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    if args.variants:
        names += [v for v in VARIANTS if v not in names]
    for name in names:
        system_for(name)  # fail before any work on a typo
    return names


def _listing() -> str:
    lines = ["scenarios:"]
    lines += [f"  {name:13s} {d.about}" for name, d in SCENARIOS.items()]
    lines += [f"  {STORM:13s} clients that retry on 429: obedient and hammering (not in all)"]
    lines += ["systems (combine variants with +, e.g. admitted+redis-time):"]
    lines += [f"  {name:13s} {s.about}" for name, s in SYSTEMS.items()]
    return "\n".join(lines)


def _plot(runs: list[Run], path: str, many: bool, args: argparse.Namespace) -> None:
    from simulator.plot import plot_runs

    target = Path(path)
    setup = runs[0].setup
    if many:
        tag = f"{setup.params.algorithm.text}-" if args.algorithm else ""
        target = target.with_name(f"{target.stem}-{tag}{setup.name}{target.suffix}")
    plot_runs(runs, str(target), args.plot_from, args.plot_windows)
    print(f"plot: {target}", file=sys.stderr)


def _run_all(
    args: argparse.Namespace, names: list[str], base: SimParams, systems: list[str]
) -> list[Summary]:
    """Every algorithm asked for, on every scenario named, with the systems that can run it."""
    summaries = []
    runnable = {a: _runnable(a, systems) for a in _algorithms(args)}
    many = len(names) > 1 or len(runnable) > 1
    for algorithm, runs_it in runnable.items():
        for name in names:
            params = replace(base, scenario=name, algorithm=algorithm)
            runs = run_scenario(params, runs_it, args.repeat)
            summaries += [run.summary for run in runs]
            if args.plot:
                _plot(runs, args.plot, many, args)
    return summaries


def main(argv: Sequence[str]) -> int:
    argv = list(argv)
    if argv[:1] == ["scale"]:  # the fleet at internet scale: docs/SCALE.md
        from simulator.scale_report import main as scale_main

        return scale_main(argv[1:])
    parser = build_parser()
    if argv[:1] == ["--"]:  # `ratelimit-sidecar simulate -- --flag`: see docs/ACCURACY.md
        argv = argv[1:]
    args = parser.parse_args(argv)
    if args.list:
        print(_listing())
        return 0
    names = list(SCENARIOS) if args.scenario == "all" else args.scenario.split(",")
    try:
        base, systems = _params(args), _systems(args)
        if names == [STORM]:
            from simulator.stormrun import storm_report

            for algorithm in _algorithms(args):
                params = replace(base, algorithm=algorithm)
                print(storm_report(params, _storm(args), args.repeat, args.format, args.plot))
            return 0
        if args.plot:
            from simulator.plot import pyplot

            pyplot()  # a missing matplotlib is reported before minutes of simulation
        summaries = _run_all(args, names, base, systems)
    except (ValueError, RuntimeError) as exc:
        print(f"ratelimit-sidecar simulate: error: {exc}", file=sys.stderr)
        return 2
    print(render(summaries, args.format, "classic" if args.algorithm is None else "rule"))
    return 0

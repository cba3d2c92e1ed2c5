"""`bench overhead` for each algorithm: eventual (local-only) rules against the empty grpc.aio
handler.

Per workload (hot-10 with h2load, distinct-100k with Node) the empty handler and one sidecar per
algorithm (`--default-algorithm X`, the bench rule's limit unreachable: 100,000/s for
sliding_log, its most) run side by side on the pinned server core, warmed up as in `overhead`, in
alternating rounds. Target: each at least 90 % of the empty handler (median over rounds; RPS per
server CPU-second when a server was not CPU-bound).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

from bench import compare
from bench.load import runs
from bench.load.clients import H2load, LoadShape, Node
from bench.load.runs import Bench, Run
from bench.load.servers import ServerProcess, start_service, start_sidecar
from bench.overhead import MAX_KEYS, Plan, warm_up
from bench.report import Options, Outcome, conclude
from bench.workload import (
    UNREACHABLE,
    hot_10,
    key_values,
    rules_dir,
    rules_yaml,
    workload,
)
from ratelimit_sidecar.config.limitreader import MAX_LOG_REQUESTS
from ratelimit_sidecar.config.model import AlgorithmName

NAME = "algorithms"
SHAPE = LoadShape(connections=10, streams=8, settle_s=0.5, duration_s=2.0)
ROUNDS = 4  # five servers per round: fewer rounds than `overhead`, the same run length
RETRY_BUDGET_S = 90.0
TARGET_RATIO = 0.90  # each algorithm's RPS over the empty grpc.aio handler's
EMPTY = "empty"


def plans() -> list[Plan]:
    return [
        Plan(hot_10(), (H2load(),), judged=True),
        Plan(workload("distinct-100k", key_values(100_000)), (Node(),), judged=True),
    ]


def unreachable_limit(algorithm: AlgorithmName) -> int:
    """A per-second limit no run reaches, and valid for the algorithm."""
    return MAX_LOG_REQUESTS if algorithm is AlgorithmName.SLIDING_LOG else UNREACHABLE


def start_algorithm(bench: Bench, algorithm: AlgorithmName) -> ServerProcess:
    """A local-only sidecar whose rule (naming no algorithm) runs `algorithm`."""
    home = bench.workdir / algorithm.text
    home.mkdir(exist_ok=True)
    rules: Path = rules_dir(home, rules_yaml(unreachable_limit(algorithm)))
    extra = ("--max-keys", str(MAX_KEYS), "--default-algorithm", algorithm.text)
    return start_sidecar(bench.workdir, bench.pinning, rules, *extra, name=algorithm.text)


def measure_plan(
    bench: Bench, plan: Plan, chosen: Sequence[AlgorithmName], rounds: int
) -> list[Run]:
    """The empty handler and one sidecar per algorithm, each warmed up, in alternating rounds."""
    starters = [partial(start_service, bench.workdir, bench.pinning, EMPTY)]
    starters += [partial(start_algorithm, bench, algorithm) for algorithm in chosen]
    warm = partial(warm_up, bench, client=plan.clients[0], plan=plan)
    return runs.side_by_side(bench, starters, plan.clients, plan.workload, rounds, warm=warm)


def comparisons(
    measured: Sequence[Run], all_plans: Sequence[Plan], chosen: Sequence[AlgorithmName]
) -> list[compare.Comparison]:
    """Each algorithm against the empty handler, per workload and client."""
    return [
        compare.compare(measured, a.text, EMPTY, p.workload.name, c.name, by_cpu=True)
        for p in all_plans
        for c in p.clients
        for a in chosen
    ]


def run(options: Options) -> Outcome:
    started, rounds = time.monotonic(), options.rounds or ROUNDS
    print(f"[{NAME}] eventual rules of each algorithm vs an empty grpc.aio handler")
    chosen, skipped = list(AlgorithmName), list[str]()
    all_plans, measured = plans(), list[Run]()
    shape = replace(SHAPE, duration_s=options.duration_s or SHAPE.duration_s)
    with runs.session(shape, RETRY_BUDGET_S) as bench:
        for plan in all_plans:
            if runs.usable(plan.clients, skipped, f"{plan.workload.name} with "):
                measured += measure_plan(bench, plan, chosen, rounds)
    found = comparisons(measured, all_plans, chosen)
    lines = runs.render(bench, measured, rounds, skipped=skipped)
    lines += ["", compare.comparison_table(found, TARGET_RATIO), LEGEND]
    document = runs.document(bench, measured, rounds, skipped)
    document["comparisons"] = [compare.as_json(c) for c in found]
    verdicts = [c.passed(TARGET_RATIO) for c in found]
    return conclude(options, NAME, started, lines, document, verdicts=verdicts)


LEGEND = f"""\
ratio = median over rounds of algorithm / empty in the same round (basis: RPS, or RPS per
second of server CPU when a server was not CPU-bound); round range = the lowest and highest
single round; p99 ratio = median over rounds of p99 / the empty handler's p99. Target: ratio
>= {TARGET_RATIO:.0%}. Rule: {UNREACHABLE:,}/s ({MAX_LOG_REQUESTS:,}/s for sliding_log)."""

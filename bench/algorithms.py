"""`bench overhead` for each algorithm: eventual (local-only) rules against the empty grpc.aio
handler. Per workload (hot-10 with h2load, distinct-100k with leanload) the empty handler and one
sidecar per algorithm (`--default-algorithm X`, a limit no run reaches: 100,000/s for
sliding_log, its most) run side by side on the pinned core, warmed up as in `overhead`. Target:
each at least 90 % of the empty handler (bench/compare.py's median ratio, by CPU when idle).
"""

from __future__ import annotations

from functools import partial

from bench import compare
from bench.load import runs
from bench.load.runs import Bench
from bench.load.servers import ServerProcess, start_service, start_sidecar
from bench.overhead import MAX_KEYS, each_plan, plans
from bench.report import Options, Outcome, conclude
from bench.workload import UNREACHABLE, rules_yaml
from ratelimit_sidecar.config.limitreader import MAX_LOG_REQUESTS
from ratelimit_sidecar.config.model import AlgorithmName

ROUNDS = 4  # five servers per round: fewer rounds than `overhead`, the same run length
RETRY_BUDGET_S = 90.0
TARGET_RATIO = 0.90  # each algorithm's RPS over the empty grpc.aio handler's


def unreachable_limit(algorithm: AlgorithmName) -> int:
    """A per-second limit no run reaches, and valid for the algorithm."""
    return MAX_LOG_REQUESTS if algorithm is AlgorithmName.SLIDING_LOG else UNREACHABLE


def start_algorithm(bench: Bench, algorithm: AlgorithmName) -> ServerProcess:
    """A local-only sidecar whose rule (naming no algorithm) runs `algorithm`."""
    rules = rules_yaml(unreachable_limit(algorithm))
    extra = ("--max-keys", str(MAX_KEYS), "--default-algorithm", algorithm.text)
    return start_sidecar(bench, *extra, rules=rules, name=algorithm.text)


def run(options: Options) -> Outcome:
    with runs.session(options, RETRY_BUDGET_S, ROUNDS) as bench:
        starters = [partial(start_service, bench, "empty")]
        starters += [partial(start_algorithm, bench, algorithm) for algorithm in AlgorithmName]
        measured = each_plan(bench, plans(full=False), starters)
    names = [a.text for a in AlgorithmName]
    found = compare.against(measured, "empty", names, target=TARGET_RATIO, by_cpu=True)
    lines, document = compare.report(bench, measured, found, legend=LEGEND)
    return conclude(options, lines, document, compare.verdicts(found))


LEGEND = f"Rule: {UNREACHABLE:,}/s ({MAX_LOG_REQUESTS:,}/s for sliding_log)."

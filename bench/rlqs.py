"""End to end, Envoy's Rate Limit Quota Service against the other ways through Envoy.

Four stacks (bench/envoy.py): plain (no filter), rlqs-allow-all (rate_limit_quota, a server
answering ALLOW_ALL: the ceiling), rlqs-sidecar (the same filter, the sidecar's assignments) and
rls-sidecar (ratelimit, ShouldRateLimit per request). One wrk per stack loads all four AT ONCE,
the stacks on one core and the wrks on the other: on a noisy machine a slowdown hits every stack
of a round alike. Sharing the core, they compare by RPS per second of their own CPU.

A run is valid when wrk saw only 2xx and the RLS stack's Envoy counted every call answered;
after the runs the RLQS stacks must hold their stream open and the sidecar must have sent token
buckets, received usage and refused nothing. Target: rlqs-sidecar at least 95 % of
rlqs-allow-all per core.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from bench import compare
from bench.envoy import API_KEY, WORK, Stack, details, gateway, role_us
from bench.load import runs
from bench.load.clients import LoadShape, Wrk
from bench.load.runs import Bench, Run
from bench.report import Options, Outcome, conclude, fmt

SHAPE = LoadShape(connections=8, streams=1, settle_s=0.0, duration_s=3.0)  # per stack
ROUNDS = 8
WARM_UP_S = 2  # the RLQS stacks' first report and assignment land in it
STACKS = ("plain", "rlqs-allow-all", "rlqs-sidecar", "rls-sidecar")
# (stack, baseline, target): the comparisons reported; only the first has a target
COMPARISONS = (
    ("rlqs-sidecar", "rlqs-allow-all", 0.95),
    ("rlqs-sidecar", "plain", None),
    ("rlqs-allow-all", "plain", None),
    ("rls-sidecar", "plain", None),
)


def problems(stack: Stack) -> list[str]:
    """Why an RLQS stack's runs do not show its filter at work (read after the runs)."""
    if not stack.name.startswith("rlqs"):
        return []
    # the stream is a request that never ends: one active while it is up
    if not stack.envoy.stat("cluster.ratelimit_sidecar.upstream_rq_active"):
        return ["no RLQS stream open to the server"]
    if stack.service is None or not stack.service.metrics_url:
        return []
    found = stack.service.metrics("ratelimit_sidecar_rlqs_")
    denied = found.get('requests_total{result="denied"}', 0)
    wrong = [] if found.get('assignments_total{action="token_bucket"}') else ["no token bucket"]
    wrong += [] if found.get('requests_total{result="allowed"}') else ["no usage reported"]
    return wrong + ([f"Envoy refused {denied:.0f} requests"] if denied else [])


def measure(bench: Bench, problems_found: list[str]) -> list[Run]:
    wrk, measured = Wrk({"x-api-key": API_KEY}), list[Run]()
    with runs.started([partial(Stack, name, bench) for name in STACKS], lambda _: None) as stacks:
        for stack in stacks:
            stack.resume()
        runs.timed_run(bench.load(WARM_UP_S), stacks, wrk, WORK, check=False)  # warm-up
        for round_no in range(bench.rounds):
            found = runs.timed_run(bench, stacks, wrk, WORK, check=False)
            found = [replace(r, round_no=round_no) for r in found]
            cells = [f"{r.server} {r.rps:,.0f} ({fmt(r.per_cpu_second)}/core)" for r in found]
            print(f"  round {round_no + 1}: {'  '.join(cells)}", flush=True)
            measured += found
        problems_found += [f"{s.name}: {p}" for s in stacks for p in problems(s)]
    return measured


def run(options: Options) -> Outcome:
    problems_found: list[str] = []
    measure_all = partial(measure, problems_found=problems_found)
    bench, measured = gateway(options, SHAPE, 0.0, ROUNDS, measure_all)
    found = [
        compare.compare(measured, stack, base, WORK.name, Wrk.name, target=goal, by_cpu=True)
        for stack, base, goal in COMPARISONS
    ]
    columns = [("RPS per core", lambda r: fmt(r.per_cpu_second))]
    columns += [role_us("envoy"), role_us("service")]
    lines, document = compare.report(bench, measured, found, columns=columns, legend=LEGEND)
    lines += [f"  INVALID: {p}" for p in problems_found]
    document |= details(measured) | {"problems": problems_found}
    verdicts = [False if problems_found else found[0].passed]
    return conclude(options, lines, document, verdicts)


LEGEND = """\
All four stacks share one core: RPS is a share of it; RPS per core = RPS per second of the
stack's own CPU (Envoy + service), its capacity on a core of its own: the comparisons' basis."""

"""The sidecar against empty handlers, each on one pinned core, driven by the same load
generator at the same concurrency, side by side in the same rounds: the sidecar on its fast
transport (the default), an empty handler on that transport (`empty-fast`, its ceiling), the
sidecar on grpcio (`--transport grpcio`, `sidecar-grpcio`) and an empty grpc.aio handler
(`empty`, grpcio's ceiling). In three workloads:

* hot-10: 10 descriptor values. h2load (10 processes, one body and one connection each) decides;
  the Node http2 client cycling the same 10 bodies cross-checks.
* distinct-100k: 100,000 distinct values, cycled by the Node client (h2load cannot vary its
  body). The warm-up sends every value once, and each run continues the rotation where the last
  stopped: the steady state of 100,000 clients that keep coming back.
* fresh-300k: 300,000 values, more than a section sends, so every request is one the sidecar
  has never seen (a flood of random values). No target: it shows what such a flood costs.

Targets, in hot-10 and distinct-100k, each the median over rounds of the ratio within a round:
the sidecar's RPS is at least 80 % of empty-fast's, and at least 4 times sidecar-grpcio's and
empty's. When a server was not CPU-bound its RPS
understates what it can do, and the ratio of RPS per second of server CPU decides instead. A
workload with other load on the server CPU is reported but not judged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

from bench.load import runs
from bench.load.clients import Client, H2load, LoadShape, Node
from bench.load.runs import SATURATED_PCT, Bench, Run
from bench.load.servers import ServerProcess, start_service, start_sidecar
from bench.report import Options, Outcome, conclude, pct
from bench.workload import Workload, hot_10, key_values, rules_dir, workload

NAME = "overhead"
SHAPE = LoadShape(connections=10, streams=8, settle_s=0.5, duration_s=2.0)
ROUNDS = 6  # short runs, many rounds: a VM's CPU speed drifts within seconds
WARM_UP_S = 2.0
WARM_UP_MAX_S = 60.0  # warm-up goes on until every body was sent once, at most this long
WARM_UP_MARGIN = 1.1  # a further warm-up run lasts this much longer than the bodies left need
MAX_KEYS = 200_000  # above distinct-100k's key count: measures decisions, not eviction
RETRY_BUDGET_S = 60.0
# (server, baseline, target ratio): what the sidecar's RPS is judged against
TARGETS = (
    ("sidecar", "empty-fast", 0.80),
    ("sidecar", "empty", 4.0),
    ("sidecar", "sidecar-grpcio", 4.0),
)


@dataclass(frozen=True, slots=True)
class Plan:
    workload: Workload
    clients: tuple[Client, ...]
    judged: bool  # False: shown without a target
    warm_every_body: bool = True  # False: the runs must meet bodies the sidecar never saw


def plans() -> list[Plan]:
    h2load, node = H2load(), Node()
    return [
        Plan(hot_10(), (h2load, node), judged=True),
        Plan(workload("distinct-100k", key_values(100_000)), (node,), judged=True),
        Plan(workload("fresh-300k", key_values(300_000, "n")), (node,), False, False),
    ]


def warm_up(bench: Bench, server: ServerProcess, client: Client, plan: Plan) -> None:
    """At least WARM_UP_S; for `warm_every_body`, until every body was sent once, each further
    run sized from the rate of the last, so that it ends when the bodies do."""
    deadline, seconds, sent = time.monotonic() + WARM_UP_MAX_S, WARM_UP_S, 0
    bodies = len(plan.workload.frames)
    while True:
        started = time.monotonic()
        batch = runs.warm_up(bench, server, client, plan.workload, seconds)
        sent, now = sent + batch, time.monotonic()
        if not plan.warm_every_body or batch <= 0 or sent >= bodies or now >= deadline:
            break
        rate = batch / (now - started)  # with the client's start-up: errs long
        seconds = min(deadline - now, max(WARM_UP_S, WARM_UP_MARGIN * (bodies - sent) / rate))
    if plan.warm_every_body and 0 < sent < bodies:
        print(f"  warm-up of {server.name} sent {sent:,} of {bodies:,}")


def measure_plan(bench: Bench, plan: Plan, clients: Sequence[Client], rounds: int) -> list[Run]:
    """Both servers, each warmed up, then `rounds` alternating rounds per client."""
    max_keys = ("--max-keys", str(MAX_KEYS))
    rules = rules_dir(bench.workdir)
    servers = [start_service(bench.workdir, bench.pinning, "empty")]
    try:
        servers.append(start_service(bench.workdir, bench.pinning, "empty-fast"))
        servers.append(start_sidecar(bench.workdir, bench.pinning, rules, *max_keys))
        grpcio = ("--transport", "grpcio")
        servers.append(
            start_sidecar(
                bench.workdir, bench.pinning, rules, *max_keys, *grpcio, name="sidecar-grpcio"
            )
        )
        for server in servers:
            warm_up(bench, server, clients[0], plan)
            server.pause()
        return runs.alternate(bench, servers, clients, plan.workload, rounds)
    finally:
        for server in servers:
            server.stop()


@dataclass(frozen=True, slots=True)
class Verdict:
    workload: str
    client: str
    baseline: str
    passed: bool | None  # None: not judged (no target, cross-check, invalid or noisy)
    ratio: float | None  # the deciding median over rounds of sidecar / empty
    summary: str


def judge(
    measured: Sequence[Run], plan: Plan, client: str, target: tuple[str, str, float]
) -> Verdict:
    name, (mine, base, goal) = plan.workload.name, target
    found = {r.server: r for r in runs.rows(measured) if (r.workload, r.client) == (name, client)}
    baseline, sidecar = found.get(base), found.get(mine)
    head = f"{name} [{client}] {mine}/{base}"
    if baseline is None or sidecar is None or not baseline.rps:
        return Verdict(name, client, base, None, None, f"{head}: NOT MEASURED")
    rounds = [r for r in measured if r.workload == name]
    rps = runs.ratios(rounds, mine, base, client)
    per_cpu = runs.ratios(rounds, mine, base, client, lambda r: r.per_cpu_second)
    saturated = min(baseline.cpu.server_pct, sidecar.cpu.server_pct) >= SATURATED_PCT
    ratio = runs.median(rps if saturated else per_cpu)
    passed = ratio is not None and ratio >= goal
    word, noisy = ("PASS" if passed else "FAIL"), baseline.cpu.noisy or sidecar.cpu.noisy
    primary = plan.judged and client == plan.clients[0].name
    if noisy:
        word = f"INCONCLUSIVE (other load on the server CPU; would be {word})"
    elif not primary:
        word = f"{'cross-check' if plan.judged else 'no target'}, would be {word}"
    if baseline.errors or sidecar.errors:
        primary, word = False, "INVALID: failed requests (see notes)"
    basis = "RPS" if saturated else "RPS per server CPU-second: a server was not CPU-bound"
    text = (
        f"{head}: {word}: {pct(ratio)} ({basis}; median of {len(rps)} rounds;"
        f" target {pct(goal)}); pooled RPS {sidecar.rps:,.0f} / {baseline.rps:,.0f}"
    )
    if rps:
        text += f"; RPS ratio per round {min(rps):.1%} .. {max(rps):.1%}"
    return Verdict(name, client, base, passed if primary and not noisy else None, ratio, text)


def run(options: Options) -> Outcome:
    started, all_plans, skipped = time.monotonic(), plans(), list[str]()
    rounds = options.rounds or ROUNDS
    print(f"[{NAME}] sidecar vs empty handlers, fast transport and grpcio, under load")
    measured: list[Run] = []
    shape = replace(SHAPE, duration_s=options.duration_s or SHAPE.duration_s)
    with runs.session(shape, RETRY_BUDGET_S) as bench:
        for plan in all_plans:
            if clients := runs.usable(plan.clients, skipped, f"{plan.workload.name} with "):
                measured += measure_plan(bench, plan, clients, rounds)
    verdicts = [
        judge(measured, plan, c.name, target)
        for plan in all_plans
        for c in plan.clients
        for target in TARGETS
    ]
    ratio = {(v.workload, v.client, v.baseline): pct(v.ratio) for v in verdicts}

    def versus(baseline: str) -> Callable[[Run], str]:
        def cell(row: Run) -> str:
            key = (row.workload, row.client, baseline)
            return ratio.get(key, "") if row.server == "sidecar" else ""

        return cell

    columns = [(f"vs {base}", versus(base)) for _, base, _ in TARGETS]
    lines = runs.render(bench, measured, rounds, columns, LEGEND)
    lines += [f"  not measured: {s}" for s in skipped] + [v.summary for v in verdicts]
    document = {**runs.document(bench, measured, rounds), "skipped": skipped}
    document["verdicts"] = [asdict(v) for v in verdicts]
    return conclude(options, NAME, started, lines, document, verdicts=[v.passed for v in verdicts])


LEGEND = """\
vs X = median over rounds of sidecar / X in the same round: RPS, or RPS per second of server
CPU when a server was not CPU-bound (its RPS then understates what it can do)."""

"""The sidecar against an empty grpc.aio handler on the same stack, each on one pinned core,
driven by the same load generator at the same concurrency, in three workloads:

* hot-10: 10 descriptor values. h2load (10 processes, one body and one connection each) decides;
  the Node http2 client cycling the same 10 bodies cross-checks.
* distinct-100k: 100,000 distinct values, cycled by the Node client (h2load cannot vary its
  body). The warm-up sends every value once, and each run continues the rotation where the last
  stopped: the steady state of 100,000 clients that keep coming back.
* fresh-300k: 300,000 values, more than a section sends, so every request is one the sidecar
  has never seen (a flood of random values). No target: it shows what such a flood costs.

Target: the sidecar's RPS is at least 90 % of the empty handler's in hot-10 and distinct-100k,
as the median over rounds of the ratio within a round. When a server was not CPU-bound its RPS
understates what it can do, and the ratio of RPS per second of server CPU decides instead. A
workload with other load on the server CPU is reported but not judged.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
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
TARGET_RATIO = 0.90


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
    servers = [start_service(bench.workdir, bench.pinning, "empty")]
    try:
        servers.append(
            start_sidecar(bench.workdir, bench.pinning, rules_dir(bench.workdir), *max_keys)
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
    passed: bool | None  # None: not judged (no target, cross-check, invalid or noisy)
    ratio: float | None  # the deciding median over rounds of sidecar / empty
    summary: str


def judge(measured: Sequence[Run], plan: Plan, client: str) -> Verdict:
    name = plan.workload.name
    found = {r.server: r for r in runs.rows(measured) if (r.workload, r.client) == (name, client)}
    empty, sidecar = found.get("empty"), found.get("sidecar")
    head = f"{name} [{client}]"
    if empty is None or sidecar is None or not empty.rps:
        return Verdict(name, client, None, None, f"{head}: NOT MEASURED")
    mine = [r for r in measured if r.workload == name]
    rps = runs.ratios(mine, "sidecar", "empty", client)
    per_cpu = runs.ratios(mine, "sidecar", "empty", client, lambda r: r.per_cpu_second)
    saturated = min(empty.cpu.server_pct, sidecar.cpu.server_pct) >= SATURATED_PCT
    ratio = runs.median(rps if saturated else per_cpu)
    passed = ratio is not None and ratio >= TARGET_RATIO
    word, noisy = ("PASS" if passed else "FAIL"), empty.cpu.noisy or sidecar.cpu.noisy
    primary = plan.judged and client == plan.clients[0].name
    if noisy:
        word = f"INCONCLUSIVE (other load on the server CPU; would be {word})"
    elif not primary:
        word = f"{'cross-check' if plan.judged else 'no target'}, would be {word}"
    if empty.errors or sidecar.errors:
        primary, word = False, "INVALID: failed requests (see notes)"
    basis = "RPS" if saturated else "RPS per server CPU-second: a server was not CPU-bound"
    text = (
        f"{head}: {word}: sidecar/empty = {pct(ratio)} ({basis}; median of {len(rps)} rounds;"
        f" target {TARGET_RATIO:.0%}); pooled RPS {sidecar.rps:,.0f} / {empty.rps:,.0f}"
        f" = {pct(sidecar.rps / empty.rps)}"
    )
    if rps:
        text += f"; RPS ratio per round {min(rps):.1%} .. {max(rps):.1%}"
    return Verdict(name, client, passed if primary and not noisy else None, ratio, text)


def run(options: Options) -> Outcome:
    started, all_plans, skipped = time.monotonic(), plans(), list[str]()
    rounds = options.rounds or ROUNDS
    print(f"[{NAME}] sidecar vs an empty grpc.aio handler under load")
    measured: list[Run] = []
    shape = replace(SHAPE, duration_s=options.duration_s or SHAPE.duration_s)
    with runs.session(shape, RETRY_BUDGET_S) as bench:
        for plan in all_plans:
            if clients := runs.usable(plan.clients, skipped, f"{plan.workload.name} with "):
                measured += measure_plan(bench, plan, clients, rounds)
    verdicts = [judge(measured, plan, c.name) for plan in all_plans for c in plan.clients]
    ratio = {(v.workload, v.client): pct(v.ratio) for v in verdicts}

    def vs_empty(row: Run) -> str:
        return ratio.get((row.workload, row.client), "") if row.server == "sidecar" else ""

    lines = runs.render(bench, measured, rounds, [("vs empty", vs_empty)], LEGEND)
    lines += [f"  not measured: {s}" for s in skipped] + [v.summary for v in verdicts]
    document = {**runs.document(bench, measured, rounds), "skipped": skipped}
    document["verdicts"] = [asdict(v) for v in verdicts]
    return conclude(options, NAME, started, lines, document, verdicts=[v.passed for v in verdicts])


LEGEND = """\
vs empty = median over rounds of sidecar / empty in the same round: RPS, or RPS per second of
server CPU when a server was not CPU-bound (its RPS then understates what it can do)."""

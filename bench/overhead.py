"""The sidecar against empty handlers, each on one pinned core, the same load generator and
concurrency, side by side in the same rounds: the sidecar on its fast transport, an empty
handler on it (`empty-fast`, its ceiling; `count-fast` also counts each body in a dict, the floor
of per-client state), the sidecar on grpcio (`sidecar-grpcio`) and an empty
grpc.aio handler (`empty`, grpcio's ceiling). Workloads:

* hot-10: 10 values. h2load (one process, body and connection per value) decides;
  bench/leanload.c and bench/rawload.py cycling the same bodies cross-check.
* distinct-100k: 100,000 values cycled by leanload (h2load cannot vary its body; leanload is
  in C with a process per connection as h2load is, and on hot-10 reads nearer to h2load than
  rawload, in Python, does); rawload cross-checks. The warm-up sends each once, each run
  continues the rotation: 100,000 clients that keep coming back.
* fresh-300k: more values than a section sends, every request new (a flood of random values).
  No target: it shows what such a flood costs.

Targets in hot-10 and distinct-100k (bench/compare.py's median over rounds of the ratio within a
round; RPS per second of server CPU when a server was not CPU-bound; not judged under other
load): the sidecar's RPS at least 80 % of empty-fast's and 4 times sidecar-grpcio's and empty's.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from bench import compare, frameloop, services
from bench.load import runs
from bench.load.clients import Client, H2load, RawLoad
from bench.load.leanload import LeanLoad
from bench.load.runs import Bench, Run
from bench.load.servers import ServerProcess, start_service, start_sidecar
from bench.report import Options, Outcome, conclude, pct
from bench.workload import Workload, handler, hot_10, key_values, unframe, workload
from ratelimit_sidecar.grpc_server.rls import RateLimitServicer
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.sync.store_clock import StoreClock

ROUNDS = 6  # short runs, many rounds: a VM's CPU speed drifts within seconds
WARM_UP_S = 2.0
WARM_UP_MAX_S = 60.0  # warm-up goes on until every body was sent once, at most this long
WARM_UP_MARGIN = 1.1  # a further warm-up run lasts this much longer than the bodies left need
MAX_KEYS = 200_000  # above distinct-100k's key count: measures decisions, not eviction
RETRY_BUDGET_S = 60.0
# A source tree whose sidecar also runs, as `sidecar-before` (a change's before and after in one
# run): BENCH_BEFORE_TREE=/path/to/checkout python -m bench overhead
BEFORE_TREE = "BENCH_BEFORE_TREE"
STAGE_REPEATS = 7  # in-process timing loops per stage: the fastest counts
STAGE_CALLS = 100_000  # calls per loop
TARGETS = (("empty-fast", 0.80), ("empty", 4.0), ("sidecar-grpcio", 4.0))  # the sidecar's
FLOOR = ("count-fast", None)  # shown, not judged: what per-client state costs any limiter


@dataclass(frozen=True, slots=True)
class Plan:
    workload: Workload
    clients: tuple[Client, ...]  # the first decides, the others cross-check
    judged: bool  # False: shown without a target
    warm_every_body: bool = True  # False: the runs must meet bodies the sidecar never saw


def plans(full: bool = True) -> list[Plan]:
    """hot-10 (h2load; with `full`, leanload and rawload cross-check), distinct-100k (leanload;
    with `full`, rawload cross-checks) and with `full` fresh-300k (leanload)."""
    h2load, lean, raw = H2load(), LeanLoad(), RawLoad()
    found = [
        Plan(hot_10(), (h2load, lean, raw) if full else (h2load,), judged=True),
        Plan(
            workload("distinct-100k", key_values(100_000)), (lean, raw) if full else (lean,), True
        ),
    ]
    fresh = Plan(workload("fresh-300k", key_values(300_000, "n")), (lean,), False, False)
    return [*found, fresh] if full else found


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


def each_plan(
    bench: Bench, all_plans: Sequence[Plan], starters: Sequence[Callable[[], ServerProcess]]
) -> list[Run]:
    """Per plan whose clients are installed, the servers side by side, warmed up as `warm_up`."""
    measured: list[Run] = []
    for plan in all_plans:
        if clients := runs.usable(bench, plan.clients, f"{plan.workload.name} with "):
            warm = partial(warm_up, bench, client=clients[0], plan=plan)
            measured += runs.side_by_side(bench, starters, clients, plan.workload, warm=warm)
    return measured


def starters(bench: Bench) -> list[partial[ServerProcess]]:
    """empty, empty-fast, the sidecar on each transport, and `sidecar-before` if asked for."""
    sidecar = partial(start_sidecar, bench, "--max-keys", str(MAX_KEYS))
    found = [partial(start_service, bench, kind) for kind in ("empty", "empty-fast", "count-fast")]
    found += [sidecar, partial(sidecar, "--transport", "grpcio", name="sidecar-grpcio")]
    if before := os.environ.get(BEFORE_TREE):  # that tree first on PYTHONPATH
        found.append(partial(sidecar, name="sidecar-before", env={"PYTHONPATH": before}))
    return found


def stage_costs(load: Workload, cpus: frozenset[int]) -> dict[str, float]:
    """µs per call of bench/frameloop.py's stages less one Python call's cost, `servicer`
    (what the fast transport calls: the sampled timing, the error mapping) and `in transport`
    (what the servicer adds to empty-fast's answer inside the transport's frame loop: the
    workload's bodies as fresh reads, the caches shared with the frame loop); pinned to the
    servers' CPU, on the workload's bodies each decided once first (the steady state)."""
    clock, metrics = StoreClock(), Metrics()
    decider = handler(MAX_KEYS, clock.now_ms, metrics)
    servicer = RateLimitServicer(decider, metrics.decision_seconds.observe)
    bodies = [unframe(frame) for frame in load.frames]
    calls = [bodies[i % len(bodies)] for i in range(max(STAGE_CALLS, len(bodies)))]
    deque(map(servicer.answer, bodies), maxlen=0)
    stages = {**frameloop.stages(decider), "servicer": servicer.answer}
    reads = frameloop.all_reads(calls)
    prebuilt = services.answer(1).SerializeToString()  # empty-fast's
    framed = {"empty": lambda _body: prebuilt, "sidecar": servicer.answer}
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        # Interleaved rounds: a burst of other load on the CPU spoils one loop of each stage.
        loops = [
            *((n, _loop(f, calls)) for _ in range(STAGE_REPEATS) for n, f in stages.items()),
            *((n, frameloop.answered(a, reads)) for _ in range(STAGE_REPEATS)
              for n, a in framed.items()),
        ]  # fmt: skip
    finally:
        os.sched_setaffinity(0, affinity)
    best = {name: min(us for n, us in loops if n == name) for name in (*stages, *framed)}
    costs = {name: max(0.0, best[name] - best["call"]) for name in stages if name != "call"}
    return {**costs, "in transport": max(0.0, best["sidecar"] - best["empty"])}


def _loop(stage: Callable[[bytes], Any], calls: Sequence[bytes]) -> float:
    started = time.perf_counter()
    deque(map(stage, calls), maxlen=0)
    return (time.perf_counter() - started) / len(calls) * 1e6


def ceiling(versus_empty: compare.Comparison, empty: Run | None, added_us: float) -> str:
    """The best sidecar rate this transport allows: empty-fast's cost per call plus what the
    sidecar's answer adds inside the transport (`stage_costs`, in transport); the sidecar's
    rate as a share of it."""
    c, sidecar = versus_empty, versus_empty.server_row
    head = f"{c.workload} [{c.client}] ceiling"
    if empty is None or sidecar is None:
        return f"{head}: NOT MEASURED"
    by_rps = c.basis == "RPS"  # compare.py's: the sidecar or empty-fast was not CPU-bound
    rate: Callable[[Run], float] = lambda r: r.rps if by_rps else r.per_cpu_second or 0.0  # noqa: E731
    if not rate(empty) or not rate(sidecar):
        return f"{head}: NOT MEASURED (no rate)"
    empty_us = 1e6 / rate(empty)
    best = 1e6 / (empty_us + added_us)
    return (
        f"{head}: empty-fast {empty_us:.1f} µs + in transport {added_us:.1f} µs = {best:,.0f}"
        f" ({c.basis}); sidecar {rate(sidecar):,.0f} = {pct(rate(sidecar) / best)}"
        f" of the ceiling (criterion: {pct(rate(sidecar) / rate(empty))} of empty-fast, target"
        f" 80 %; the ceiling is {pct(best / rate(empty))} of empty-fast)"
    )


def run(options: Options) -> Outcome:
    all_plans = plans()
    with runs.session(options, RETRY_BUDGET_S, ROUNDS) as bench:
        measured = each_plan(bench, all_plans, starters(bench))
        cpus = bench.pinning.server_cpus
        costs = {p.workload.name: stage_costs(p.workload, cpus) for p in all_plans if p.judged}
    found = [
        compare.compare(measured, "sidecar", base, plan.workload.name, client.name, by_cpu=True,
                        target=goal if plan.judged and client is plan.clients[0] else None)
        for plan in all_plans for client in plan.clients for base, goal in (*TARGETS, FLOOR)
    ]  # fmt: skip
    lines, document = compare.report(bench, measured, found)
    empty = {(r.workload, r.client): r for r in runs.rows(measured) if r.server == "empty-fast"}
    for name, stages in costs.items():
        shown = ", ".join(f"{stage} {us:.2f}" for stage, us in stages.items())
        lines.append(f"{name} in process (µs per call; lookup to handler cumulative): {shown}")
        for c in found:
            if c.workload == name and c.baseline == "empty-fast":
                lines.append(ceiling(c, empty.get((name, c.client)), stages["in transport"]))
    document["stages"] = costs
    return conclude(options, lines, document, compare.verdicts(found))

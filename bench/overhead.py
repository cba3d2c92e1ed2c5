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

import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.load import runs
from bench.load.clients import Client, H2load, LoadShape, Node
from bench.load.runs import SATURATED_PCT, Bench, Run
from bench.load.servers import ServerProcess, start_service, start_sidecar
from bench.report import Options, Outcome, conclude, pct
from bench.workload import Workload, handler, hot_10, key_values, rules_dir, unframe, workload
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.server.grpc_api import RateLimitServicer
from ratelimit_sidecar.server.storeclock import StoreClock

NAME = "overhead"
SHAPE = LoadShape(connections=10, streams=8, settle_s=0.5, duration_s=2.0)
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
        if before := os.environ.get(BEFORE_TREE):
            servers.append(_sidecar_from(before, bench, rules, *max_keys))
        for server in servers:
            warm_up(bench, server, clients[0], plan)
            server.pause()
        return runs.alternate(bench, servers, clients, plan.workload, rounds)
    finally:
        for server in servers:
            server.stop()


def _sidecar_from(tree: str, bench: Bench, rules: Path, *extra: str) -> ServerProcess:
    """`sidecar-before`: the sidecar of another source tree (first on PYTHONPATH)."""
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = tree
    try:
        return start_sidecar(bench.workdir, bench.pinning, rules, *extra, name="sidecar-before")
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


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


def stage_costs(load: Workload, cpus: frozenset[int]) -> dict[str, float]:
    """µs per call of the handler's stages, in this process pinned to the servers' CPU, on the
    workload's bodies (each decided once first: the steady state). Cumulative: `lookup` finds
    the compiled request; `decision` adds the clock and the core's `hit_one`; `encoding` adds
    the answer's bytes (the bare decision: what any implementation of the API must do per
    call); `handler` is `respond_now` (adds the metrics' counters); `servicer` is what the
    fast transport calls (adds the sampled timing and the error mapping)."""
    clock, metrics = StoreClock(), Metrics()
    decider = handler(MAX_KEYS, clock.now_ms, metrics=metrics)
    servicer = RateLimitServicer(decider, metrics.decision_seconds.observe)
    bodies = [unframe(frame) for frame in load.frames]
    calls = [bodies[i % len(bodies)] for i in range(max(STAGE_CALLS, len(bodies)))]
    deque(map(servicer.answer, bodies), maxlen=0)
    get, limiter, encoder = decider._compiled.get, decider.limiter, decider._encoder

    def decision(body: bytes) -> Any:
        c = get(body)
        return limiter.hit_one(clock.now_ms(), c.hits[c.counted])  # type: ignore[union-attr]

    def encoding(body: bytes) -> bytes:
        c = get(body)
        verdict = limiter.hit_one(clock.now_ms(), c.hits[c.counted])  # type: ignore[union-attr]
        return encoder.admitted(c.before, c.head, verdict, c.after)  # type: ignore[union-attr]

    stages: dict[str, Callable[[bytes], Any]] = {
        # Each stage is one Python call per body, as `call`, whose cost is subtracted.
        "call": lambda body: body,
        "lookup": lambda body: get(body),  # noqa: PLW0108
        "decision": decision,
        "encoding": encoding,
        "handler": decider.respond_now,
        "servicer": servicer.answer,
    }
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        # Interleaved rounds: a burst of other load on the CPU spoils one loop of each stage.
        loops = [(n, _loop(f, calls)) for _ in range(STAGE_REPEATS) for n, f in stages.items()]
    finally:
        os.sched_setaffinity(0, affinity)
    best = {name: min(us for n, us in loops if n == name) for name in stages}
    return {name: max(0.0, us - best["call"]) for name, us in best.items() if name != "call"}


def _loop(stage: Callable[[bytes], Any], calls: Sequence[bytes]) -> float:
    started = time.perf_counter()
    deque(map(stage, calls), maxlen=0)
    return (time.perf_counter() - started) / len(calls) * 1e6


def ceiling(measured: Sequence[Run], load: str, client: str, bare_us: float) -> str:
    """The best sidecar rate this transport allows: empty-fast's cost per call plus the bare
    decision's (`stage_costs`, encoding); the sidecar's rate as a share of it."""
    found = {r.server: r for r in runs.rows(measured) if (r.workload, r.client) == (load, client)}
    empty, sidecar = found.get("empty-fast"), found.get("sidecar")
    if empty is None or sidecar is None:
        return f"{load} [{client}] ceiling: NOT MEASURED"
    saturated = min(empty.cpu.server_pct, sidecar.cpu.server_pct) >= SATURATED_PCT
    rate: Callable[[Run], float] = lambda r: r.rps if saturated else r.per_cpu_second or 0.0  # noqa: E731
    if not rate(empty) or not rate(sidecar):
        return f"{load} [{client}] ceiling: NOT MEASURED (no rate)"
    empty_us = 1e6 / rate(empty)
    best = 1e6 / (empty_us + bare_us)
    basis = "RPS" if saturated else "RPS per server CPU-second"
    return (
        f"{load} [{client}] ceiling: empty-fast {empty_us:.1f} µs + bare decision {bare_us:.1f}"
        f" µs = {best:,.0f} ({basis}); sidecar {rate(sidecar):,.0f} = {pct(rate(sidecar) / best)}"
        f" of the ceiling (criterion: {pct(rate(sidecar) / rate(empty))} of empty-fast, target"
        f" 80 %; the ceiling is {pct(best / rate(empty))} of empty-fast)"
    )


def run(options: Options) -> Outcome:
    started, all_plans, skipped = time.monotonic(), plans(), list[str]()
    rounds = options.rounds or ROUNDS
    print(f"[{NAME}] sidecar vs empty handlers, fast transport and grpcio, under load")
    measured: list[Run] = []
    costs: dict[str, dict[str, float]] = {}
    shape = replace(SHAPE, duration_s=options.duration_s or SHAPE.duration_s)
    with runs.session(shape, RETRY_BUDGET_S) as bench:
        for plan in all_plans:
            if clients := runs.usable(plan.clients, skipped, f"{plan.workload.name} with "):
                measured += measure_plan(bench, plan, clients, rounds)
                if plan.judged:
                    costs[plan.workload.name] = stage_costs(
                        plan.workload, bench.pinning.server_cpus
                    )
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
    for name, stages in costs.items():
        shown = ", ".join(f"{stage} {us:.2f}" for stage, us in stages.items())
        lines.append(f"{name} handler stages in process (µs per call, cumulative): {shown}")
        plan = next(p for p in all_plans if p.workload.name == name)
        lines += [ceiling(measured, name, c.name, stages["encoding"]) for c in plan.clients]
    document = {**runs.document(bench, measured, rounds), "skipped": skipped, "stages": costs}
    document["verdicts"] = [asdict(v) for v in verdicts]
    return conclude(options, NAME, started, lines, document, verdicts=[v.passed for v in verdicts])


LEGEND = """\
vs X = median over rounds of sidecar / X in the same round: RPS, or RPS per second of server
CPU when a server was not CPU-bound (its RPS then understates what it can do)."""

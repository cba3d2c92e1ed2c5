"""Issue #2, first benchmark: the sidecar against an empty grpc.aio handler.

Both servers answer ShouldRateLimit on one pinned core, driven by the same load generator with
the same concurrency, in three workloads:

* hot-10: 10 descriptor values. Primary client h2load (10 processes, one body and one
  connection each); cross-checked by the Node http2 client cycling the same 10 bodies.
* distinct-100k: 100,000 distinct values. h2load cannot vary its body, so the Node client
  cycles 100,000 precomputed frames round-robin. The warm-up sends every value once and each
  run continues the rotation where the last stopped: the steady state of 100,000 clients that
  keep coming back, not the first request of each.
* fresh-300k: 300,000 values, more than a section sends, so every request is one the sidecar
  has never seen (a flood of random values). No target: it shows what such a flood costs.

Both servers of a workload run side by side, the one not being measured stopped (SIGSTOP), and
are measured in alternating order over several short rounds (empty/sidecar, then
sidecar/empty, ...), so drift in the machine's speed hits both alike.

Target: the sidecar reaches at least 90% of the empty handler's RPS in hot-10 and distinct-100k.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench import cpu, decide_cost, machine
from bench.frames import frames_for, key_values
from bench.h2load_driver import H2loadDriver
from bench.loadgen import Driver, LoadShape, Workload
from bench.node_driver import NodeDriver
from bench.overhead_report import Report, Skipped, print_report, write_results
from bench.overhead_verdict import verdicts
from bench.rls_load import Measurement, RunContext, measure, warm_up
from bench.section import Options, Outcome
from bench.servers import ServerProcess, empty_spec, free_port, sidecar_spec, start_server

NAME = "overhead"
RESULTS_FILE = "issue2.json"
SHAPE = LoadShape(connections=10, streams=8, settle_s=0.5, duration_s=2.0)
ROUNDS = 6  # short runs, many rounds: this VM's CPU speed drifts within seconds
WARM_UP_S = 2.0
WARM_UP_MAX_S = 60.0  # warm-up goes on until every body was sent once, at most this long
WARM_UP_MARGIN = 1.1  # a further warm-up run lasts this much longer than the bodies left need
MAX_KEYS = 200_000  # above the distinct-100k key count: measures decisions, not eviction
RETRY_BUDGET_S = 60.0  # noisy runs are repeated only in the section's first minute
SERVERS = ("empty", "sidecar")
FRESH_BODIES = 300_000


@dataclass(frozen=True, slots=True)
class Plan:
    workload: Workload
    drivers: tuple[Driver, ...]
    primary: str | None  # the client whose ratio decides PASS/FAIL; None: no target
    warm_every_body: bool = True  # False: the runs must meet bodies the sidecar never saw


def plans() -> list[Plan]:
    h2load, node = H2loadDriver(), NodeDriver()
    hot = Workload("hot-10", "10 hot descriptor values", frames_for(key_values(10)))
    wide = Workload(
        "distinct-100k",
        "100,000 distinct values, each sent once in warm-up",
        frames_for(key_values(100_000)),
    )
    # More bodies than a section sends: every request is one the sidecar has never seen (a
    # flood of random values). No target: it shows what such a flood costs.
    fresh = Workload(
        "fresh-300k",
        "300,000 values, none sent twice",
        frames_for(f"n{v}" for v in key_values(FRESH_BODIES)),
    )
    return [
        Plan(hot, (h2load, node), h2load.name),
        Plan(wide, (node,), node.name),
        Plan(fresh, (node,), None, warm_every_body=False),
    ]


def shape_for(options: Options) -> LoadShape:
    if options.duration_s is None:
        return SHAPE
    return replace(SHAPE, duration_s=options.duration_s)


class Runner:
    """Per workload: both servers, each warmed up, then `rounds` alternating rounds per client."""

    def __init__(self, ctx: RunContext, rounds: int) -> None:
        self.ctx = ctx
        self.rounds = rounds
        self.deadline = time.monotonic() + RETRY_BUDGET_S
        self.runs: list[tuple[int, Measurement]] = []  # (round, run)
        self.skipped: list[Skipped] = []

    def run_plan(self, plan: Plan) -> None:
        usable = [d for d in plan.drivers if self._usable(plan, d)]
        if not usable:
            return
        servers: dict[str, ServerProcess] = {}
        try:
            for kind in SERVERS:
                servers[kind] = self._start(kind)
                self._warm_up(servers[kind], usable[0], plan.workload, plan.warm_every_body)
                servers[kind].pause()
            for round_no in range(self.rounds):
                order = SERVERS if round_no % 2 == 0 else SERVERS[::-1]
                for driver in usable:
                    for kind in order:
                        self._measure(round_no, servers[kind], driver, plan.workload)
        finally:
            for server in servers.values():
                server.stop()

    def _warm_up(
        self, server: ServerProcess, driver: Driver, workload: Workload, every_body: bool
    ) -> None:
        """At least WARM_UP_S; with `every_body`, until every body was sent once (if the driver
        counts), each further run sized from the rate of the last, so that the warm-up ends
        when the bodies do rather than on its time limit."""
        deadline = time.monotonic() + WARM_UP_MAX_S
        seconds, sent = WARM_UP_S, 0
        while True:
            started = time.monotonic()
            batch = warm_up(self.ctx, server, driver, workload, seconds)
            sent += batch
            left, now = len(workload.frames) - sent, time.monotonic()
            if not every_body or batch <= 0 or left <= 0 or now >= deadline:
                break
            rate = batch / (now - started)  # with the client's start-up: errs long
            seconds = min(deadline - now, max(WARM_UP_S, WARM_UP_MARGIN * left / rate))
        if every_body and 0 < sent < len(workload.frames):
            print(f"  warm-up of {server.spec.name} sent {sent:,} of {len(workload.frames):,}")

    def _usable(self, plan: Plan, driver: Driver) -> bool:
        reason = driver.unavailable()
        if reason is None and not driver.supports(plan.workload, self.ctx.shape):
            reason = f"cannot drive {len(plan.workload.frames)} distinct bodies"
        if reason is not None:
            self.skipped.append(Skipped(plan.workload.name, driver.name, reason))
        return reason is None

    def _start(self, kind: str) -> ServerProcess:
        address = f"127.0.0.1:{free_port()}"
        if kind == "empty":
            spec = empty_spec(address)
        else:
            spec = sidecar_spec(address, self.ctx.workdir, MAX_KEYS)
        return start_server(spec, self.ctx.pinning.server_cpu, self.ctx.workdir)

    def _measure(
        self, round_no: int, server: ServerProcess, driver: Driver, workload: Workload
    ) -> None:
        label = (
            f"  round {round_no + 1}  {workload.name:<14} {driver.name:<11} {server.spec.name:<8}"
        )
        print(label, end="", flush=True)
        server.resume()
        try:
            result = measure(self.ctx, server, driver, workload, self.deadline)
        finally:
            server.pause()
        extra = f"  (attempts: {result.attempts})" if result.attempts > 1 else ""
        print(f" {result.rps:7,.0f} req/s  server CPU {result.cpu.server_pct:3.0f}%{extra}")
        self.runs.append((round_no, result))


def run(options: Options) -> Outcome:
    started = time.monotonic()
    pinning = cpu.choose_pinning()
    machine_info = machine.describe()
    cpu.pin_self(pinning.client_cpu)
    print(f"[{NAME}] sidecar vs empty grpc.aio handler; pinning: {pinning.describe()}")
    all_plans = plans()
    with tempfile.TemporaryDirectory(prefix="rls-bench-") as tmp:
        runner = Runner(
            RunContext(shape_for(options), pinning, Path(tmp)), options.rounds or ROUNDS
        )
        for plan in all_plans:
            runner.run_plan(plan)
    targets = {p.workload.name: p.primary for p in all_plans if p.primary is not None}
    judged = verdicts(runner.runs, targets)
    costs = decide_cost.measure()  # on the client CPU, after the load runs
    elapsed = time.monotonic() - started
    untargeted = [p.workload.name for p in all_plans if p.primary is None]
    report = Report(
        runner.runs,
        runner.skipped,
        judged,
        runner.ctx.shape,
        pinning,
        elapsed,
        machine_info,
        costs,
        untargeted,
    )
    print_report(report)
    path = write_results(options.results_dir / RESULTS_FILE, report)
    print(f"results: {path}")
    measured = [v.passed for v in judged if v.passed is not None]
    return Outcome(all(measured) if measured else None, path)

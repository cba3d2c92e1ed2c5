"""Issue #5: what `--workers 2` gives over `--workers 1` on this machine, and what metrics cost.

The real CLI (`python -m ratelimit_sidecar serve --workers N`, local-only, the bench rule) is
driven by h2load with the hot-10 workload of the overhead section, over 20 connections: the
kernel's SO_REUSEPORT hashing spreads connections, not requests, so a few connections could
land unevenly; each worker's own /metrics gives the split actually served.

Nothing is pinned: 2 workers need both cores, so the 1-worker sidecar gets both too, and the
load generator shares them with the workers. With 2 cores that sharing is the ceiling of the
speed-up, and the report says how much CPU h2load took. Both fleets run side by side, the idle
one stopped (SIGSTOP), in alternating rounds as in the overhead section.

Also timed in-process (`timeit`): the decision-latency histogram and the decision counters on
the request path, against a plain no-op call (bench/hotpath_cost.py). No target: reported only.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import cpu, cpuwatch, hotpath_cost, machine
from bench.frames import RULES_YAML, frames_for, key_values
from bench.h2load_driver import H2loadDriver
from bench.loadgen import LoadShape, RunningLoad, Target, Workload
from bench.probe import probe
from bench.section import Options, Outcome
from bench.worker_fleet import Fleet
from bench.workers_report import FleetCpu, Report, Run, print_report, write_results

NAME = "workers"
RESULTS_FILE = "issue5-workers.json"
WORKER_COUNTS = (1, 2)
SHAPE = LoadShape(connections=20, streams=4, settle_s=0.5, duration_s=2.0)
ROUNDS = 4
WARM_UP_S = 1.5
MAX_KEYS = 200_000
SAMPLE_MARGIN_S = 0.3
FINISH_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class Context:
    workdir: Path
    rules: Path
    shape: LoadShape
    rounds: int
    driver: H2loadDriver
    workload: Workload


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    sidecar_s: float
    client_s: float
    self_s: float
    busy: int  # ticks, all usable CPUs


def usable_cpus() -> set[int]:
    return set(range(os.cpu_count() or 1))


def take_sample(fleet: Fleet, client_pids: list[int]) -> Sample:
    ticks = cpu.cpu_busy_ticks(usable_cpus())
    return Sample(
        time.monotonic(),
        fleet.cpu_seconds(),
        cpu.total_cpu_seconds(client_pids),
        cpu.cpu_seconds(os.getpid()),
        sum(ticks.values()),
    )


def fleet_cpu(a: Sample, b: Sample) -> FleetCpu:
    wall = max(b.at - a.at, 1e-9)
    sidecar, client = (
        100 * (b.sidecar_s - a.sidecar_s) / wall,
        100 * (b.client_s - a.client_s) / wall,
    )
    own = sidecar + client + 100 * (b.self_s - a.self_s) / wall
    busy = 100 * (b.busy - a.busy) / cpu.CLOCK_TICKS / wall
    return FleetCpu(wall, sidecar, client, max(0.0, busy - own))


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


class Runner:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.runs: list[Run] = []

    def run(self) -> None:
        fleets: dict[int, Fleet] = {}
        try:
            for count in WORKER_COUNTS:
                fleets[count] = Fleet(count, self.ctx.rules, self.ctx.workdir, MAX_KEYS)
                fleets[count].wait_ready()
                self._warm_up(fleets[count])
                fleets[count].pause()
            for round_no in range(self.ctx.rounds):
                for count in WORKER_COUNTS if round_no % 2 == 0 else WORKER_COUNTS[::-1]:
                    self._measure(round_no, fleets[count])
        finally:
            for fleet in fleets.values():
                fleet.stop()

    def _start(self, fleet: Fleet, shape: LoadShape) -> RunningLoad:
        target = Target("127.0.0.1", fleet.port)
        return self.ctx.driver.start(target, self.ctx.workload, shape, self.ctx.workdir, [])

    def _warm_up(self, fleet: Fleet) -> None:
        shape = LoadShape(self.ctx.shape.connections, self.ctx.shape.streams, 0.0, WARM_UP_S)
        self._start(fleet, shape).finish(WARM_UP_S + FINISH_GRACE_S)

    def _measure(self, round_no: int, fleet: Fleet) -> None:
        print(f"  round {round_no + 1}  {fleet.name:<9}", end="", flush=True)
        fleet.resume()
        try:
            run = self._timed_run(round_no, fleet)
        finally:
            fleet.pause()
        split = "/".join(f"{share:.0%}" for share in run.shares)
        print(
            f" {run.rps:7,.0f} req/s  sidecar CPU {run.cpu.sidecar_pct:3.0f}%  "
            f"h2load {run.cpu.client_pct:3.0f}%  split {split}"
        )
        self.runs.append(run)

    def _timed_run(self, round_no: int, fleet: Fleet) -> Run:
        pinning = cpu.choose_pinning()  # both CPUs of this machine, for the quiet check only
        quiet = cpuwatch.wait_for_quiet(pinning, [*fleet.pids, os.getpid()])
        probe(fleet.address, self.ctx.workload.frames)
        before = fleet.decisions()
        load = self._start(fleet, self.ctx.shape)
        try:
            first, last = self._samples(fleet, load.pids)
        finally:
            raw = load.finish(self.ctx.shape.settle_s + self.ctx.shape.duration_s + FINISH_GRACE_S)
        return Run(
            round_no=round_no,
            workers=fleet.workers,
            requests=raw.requests,
            duration_s=self.ctx.shape.duration_s,
            errors=raw.errors,
            first_error=raw.first_error,
            latencies_ms=raw.latencies_ms,
            cpu=fleet_cpu(first, last),
            served=[b - a for a, b in zip(before, fleet.decisions(), strict=True)],
            quiet=quiet,
        )

    def _samples(self, fleet: Fleet, client_pids: list[int]) -> tuple[Sample, Sample]:
        shape, started = self.ctx.shape, time.monotonic()
        _sleep_until(started + shape.settle_s + SAMPLE_MARGIN_S)
        first = take_sample(fleet, client_pids)
        _sleep_until(started + shape.settle_s + shape.duration_s - SAMPLE_MARGIN_S)
        return first, take_sample(fleet, client_pids)


def context(workdir: Path, options: Options) -> Context:
    rules = workdir / "rules"
    rules.mkdir()
    (rules / "bench.yaml").write_text(RULES_YAML)
    shape = SHAPE if options.duration_s is None else LoadShape(
        SHAPE.connections, SHAPE.streams, SHAPE.settle_s, options.duration_s
    )  # fmt: skip
    hot = Workload("hot-10", "10 hot descriptor values", frames_for(key_values(10)))
    return Context(workdir, rules, shape, options.rounds or ROUNDS, H2loadDriver(), hot)


def run(options: Options) -> Outcome:
    started = time.monotonic()
    info = machine.describe()
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, usable_cpus())  # workers inherit it: every CPU, nothing pinned
    try:
        print(f"[{NAME}] sidecar --workers 1 vs 2, unpinned; metrics cost on the hot path")
        costs = hotpath_cost.measure()
        with tempfile.TemporaryDirectory(prefix="rls-bench-workers-") as tmp:
            ctx = context(Path(tmp), options)
            reason = ctx.driver.unavailable()
            runner = Runner(ctx)
            if reason is None:
                runner.run()
    finally:
        os.sched_setaffinity(0, previous)
    elapsed = time.monotonic() - started
    report = Report(runner.runs, costs, ctx.shape, ctx.rounds, info, elapsed, reason)
    print_report(report)
    path = write_results(options.results_dir / RESULTS_FILE, report)
    print(f"results: {path}")
    return Outcome(None, path)

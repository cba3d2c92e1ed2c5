"""Issue #3, "Measure": the sidecar against the design it replaces, Redis on every request.

The baseline (bench/limits_server.py) is a ShouldRateLimit service on the same grpc.aio +
uvloop stack that makes one `limits` async-Redis call per descriptor per request, as the
reference Go service does. Both it and the sidecar (deciding from memory, syncing in the
background) use one real Redis started here, and run pinned to the server CPU; Redis gets the
load generators' CPU (in production it is on another host: the baseline's core is its own).

1. Redis up: hot-10 (10 descriptor values) with h2load (primary) and the Node client (which
   also checks every gRPC status), in alternating rounds as in the overhead section.
   Target: sidecar RPS at least 2x the baseline's (median of the rounds' ratios) and a lower
   p99. An empty grpc.aio handler (bench/empty_server.py) runs with the primary client as a
   reference: its RPS over the baseline's is the most any server on this stack could reach.
2. Redis hung (SIGSTOP: connections open, nothing answers) and Redis down (SIGKILL): one
   request on the idle server (its status and time to answer), then a short Node run per
   server counting OK answers and gRPC errors; h2load cannot see gRPC statuses. Target: the
   sidecar keeps answering OK with no errors while the baseline errors or stalls.
3. Redis restarted: one request per server shows whether each recovers.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from bench import cpu, machine
from bench.baseline_outage import OutageRow, first_answer, outage_load
from bench.baseline_report import REFERENCE, render, results, write_results
from bench.frames import frames_for, key_values
from bench.h2load_driver import H2loadDriver
from bench.loadgen import Driver, LoadShape, Workload
from bench.node_driver import NodeDriver
from bench.rls_load import Measurement, RunContext, measure, warm_up
from bench.section import Options, Outcome
from bench.servers import (
    ServerProcess,
    ServerSpec,
    empty_spec,
    free_port,
    sidecar_spec,
    start_server,
)
from harness.redis_servers import ServerGroup

NAME = "baseline"
RESULTS_FILE = "issue3-baseline.json"
SHAPE = LoadShape(connections=10, streams=8, settle_s=0.5, duration_s=2.0)
ROUNDS = 3
WARM_UP_S = 1.5
OUTAGE_S = 2.0  # each server's load run while Redis is hung or down (no settle time)
RETRY_BUDGET_S = 30.0  # noisy runs are repeated only in the section's first 30 s
MAX_KEYS = 10_000
SERVERS = ("baseline", "sidecar")  # measured in this order in even rounds, reversed in odd
OUTAGE_ORDER = ("sidecar", "baseline")


class RedisServer(Protocol):
    """What this section uses of harness.redis_servers.ServerProcess."""

    proc: subprocess.Popen[bytes] | None

    @property
    def url(self) -> str: ...

    def start(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def kill(self) -> None: ...


def pin_redis(redis: RedisServer, cpu_id: int | None) -> None:
    """Every thread of Redis on `cpu_id` (the load generators' CPU), if pinning is active."""
    if cpu_id is None or redis.proc is None:
        return
    argv = ["taskset", "-a", "-p", "-c", str(cpu_id), str(redis.proc.pid)]
    subprocess.run(argv, check=True, capture_output=True)


def baseline_spec(address: str, redis_url: str) -> ServerSpec:
    args = ("bench.limits_server", "--address", address, "--redis-url", redis_url)
    return ServerSpec("baseline", address, args)


def sidecar_redis_spec(address: str, workdir: Path, redis_url: str) -> ServerSpec:
    """The overhead section's sidecar command plus `--redis-url`."""
    spec = sidecar_spec(address, workdir, MAX_KEYS)
    return replace(spec, module_args=(*spec.module_args, "--redis-url", redis_url))


class Bench:
    """Redis, the two servers, and every measurement of the section."""

    def __init__(self, ctx: RunContext, redis: RedisServer, rounds: int, outage_s: float) -> None:
        self.ctx = ctx
        self.redis = redis
        self.rounds = rounds
        self.outage_shape = replace(ctx.shape, settle_s=0.0, duration_s=outage_s)
        self.deadline = time.monotonic() + RETRY_BUDGET_S
        self.servers: dict[str, ServerProcess] = {}
        self.runs: list[tuple[int, Measurement]] = []  # (round, run)
        self.outages: list[OutageRow] = []

    def start(self, warm: Driver, workload: Workload) -> None:
        """Every server, each warmed up, then paused (SIGSTOP) until its turn."""
        for kind in (*SERVERS, REFERENCE):
            self.servers[kind] = start_server(
                self._spec(kind), self.ctx.pinning.server_cpu, self.ctx.workdir
            )
            warm_up(self.ctx, self.servers[kind], warm, workload, WARM_UP_S)
            self.servers[kind].pause()

    def _spec(self, kind: str) -> ServerSpec:
        address = f"127.0.0.1:{free_port()}"
        if kind == "baseline":
            return baseline_spec(address, self.redis.url)
        if kind == "sidecar":
            return sidecar_redis_spec(address, self.ctx.workdir, self.redis.url)
        return empty_spec(address)

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()

    def compare(self, drivers: Sequence[Driver], workload: Workload) -> None:
        """Redis up: `rounds` rounds per client, the servers' order alternating."""
        for round_no in range(self.rounds):
            for index, driver in enumerate(drivers):
                kinds = (*SERVERS, REFERENCE) if index == 0 else SERVERS
                for kind in kinds if round_no % 2 == 0 else kinds[::-1]:
                    self._measure(round_no, self.servers[kind], driver, workload)

    def _measure(
        self, round_no: int, server: ServerProcess, driver: Driver, workload: Workload
    ) -> None:
        print(
            f"  round {round_no + 1}  {driver.name:<11} {server.spec.name:<9}", end="", flush=True
        )
        server.resume()
        try:
            result = measure(self.ctx, server, driver, workload, self.deadline)
        finally:
            server.pause()
        print(f" {result.rps:7,.0f} req/s  p99 {result.latency.p99_ms:6.2f} ms", flush=True)
        self.runs.append((round_no, result))

    def outage(self, redis: str, driver: Driver | None, workload: Workload) -> None:
        """Each server in turn: one request, then (with a driver) a short load run."""
        ctx = replace(self.ctx, shape=self.outage_shape)
        for kind in OUTAGE_ORDER:
            server = self.servers[kind]
            server.resume()
            try:
                answer = first_answer(server.address, workload.frames[0])
                load = None if driver is None else outage_load(ctx, server, driver, workload)
            finally:
                server.pause()
            row = OutageRow(redis, kind, answer, load)
            print(f"  Redis {redis:<9} {kind:<8}  first request {answer.describe()}: {row.state()}")
            self.outages.append(row)

    def run_all(self, drivers: Sequence[Driver], node: Driver | None, workload: Workload) -> None:
        """Redis up, hung, down, restarted."""
        self.start(drivers[0], workload)
        self.compare(drivers, workload)
        self.redis.pause()
        try:
            self.outage("hung", node, workload)
        finally:
            self.redis.resume()
        self.redis.kill()
        self.outage("down", node, workload)
        self.redis.start()
        pin_redis(self.redis, self.ctx.pinning.client_cpu)
        self.outage("restarted", None, workload)


def plan() -> tuple[Workload, list[Driver], Driver | None, list[str]]:
    """hot-10; the usable clients (h2load first); the Node client for outages; what is skipped."""
    workload = Workload("hot-10", "10 hot descriptor values", frames_for(key_values(10)))
    drivers: list[Driver] = [H2loadDriver(), NodeDriver()]
    skipped = [f"{d.name}: {d.unavailable()}" for d in drivers if d.unavailable()]
    usable = [d for d in drivers if d.unavailable() is None and d.supports(workload, SHAPE)]
    node = next((d for d in usable if d.name == NodeDriver.name), None)
    return workload, usable, node, skipped


def shape_for(options: Options) -> LoadShape:
    return SHAPE if options.duration_s is None else replace(SHAPE, duration_s=options.duration_s)


def measure_with_redis(options: Options, pinning: cpu.Pinning, workdir: Path) -> Bench:
    """Start Redis and both servers, measure everything, stop every process started here."""
    workload, drivers, node, _ = plan()
    group = ServerGroup(workdir / "redis")  # the same real server the tests start
    try:
        redis: RedisServer = group.standalone()
        pin_redis(redis, pinning.client_cpu)
        ctx = RunContext(shape_for(options), pinning, workdir)
        bench = Bench(ctx, redis, options.rounds or ROUNDS, options.duration_s or OUTAGE_S)
        try:
            if drivers:
                bench.run_all(drivers, node, workload)
        finally:
            bench.stop()
    finally:
        group.stop_all()
    return bench


def run(options: Options) -> Outcome:
    started = time.monotonic()
    pinning = cpu.choose_pinning()
    machine_info = machine.describe()
    cpu.pin_self(pinning.client_cpu)  # Redis, started from here, inherits the client CPU
    print(f"[{NAME}] sidecar vs a per-request-Redis `limits` service; {pinning.describe()}")
    with tempfile.TemporaryDirectory(prefix="rls-baseline-") as tmp:
        bench = measure_with_redis(options, pinning, Path(tmp))
    res = results(bench, plan()[3], time.monotonic() - started)
    text = render(bench, res)
    print(f"\n{text}")
    path = options.results_dir / RESULTS_FILE
    path = write_results(path, bench, res, text, machine_info, name=NAME)
    print(f"results: {path}")
    return Outcome(res.met, path)

"""Issue #4: end to end through Envoy, wrk → Envoy → sidecar versus wrk → Envoy → empty service.

Identical stacks, each an Envoy (the project's bootstrap template, `--concurrency 1`) calling
its own rate-limit service:
* empty: the empty grpc.aio handler of the overhead section (bench/empty_server.py), the
  target's baseline. It answers one status, whatever the request;
* empty-4: the same, but one status per descriptor (bench/empty_gateway_server.py), like the
  sidecar's answer to the template's four descriptors: a like-for-like cross-check, since
  Envoy turns every status into x-ratelimit headers;
* sidecar: local-only, a never-reached limit on the API key (bench/envoy_stack.RULES_YAML).
Envoy and service share the server CPU, as a sidecar shares its node with the gateway; wrk
(HTTP/1.1, `x-api-key: bench`) and this driver run on the other CPU.

One Envoy per service rather than one switched between them: switching would mean a restart
(a cold Envoy every round) or an xDS server; warmed-up twins, the idle stacks stopped (SIGSTOP)
while one is measured, differ only in the service behind them. Rounds alternate the order
(forward, then backward, ...) so drift in the machine's speed hits all alike.

Envoy fails open (`failure_mode_deny: false`, 50 ms timeout), so a 200 alone does not prove
the service answered: each run also reads Envoy's ratelimit counters, and a run with RLS errors
or fail-open decisions is invalid, as is one with non-2xx responses or socket errors.

Target: the sidecar stack reaches at least 90% of the empty stack's RPS.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import cpu, cpuwatch, machine
from bench.envoy_report import CpuUse, Report, Run, print_report, write_results
from bench.envoy_stack import (
    HEADERS,
    Stack,
    empty_per_descriptor_spec,
    envoy_available,
    sidecar_spec,
)
from bench.section import Options, Outcome
from bench.servers import ServerSpec, empty_spec, free_port
from bench.wrk_driver import Wrk, WrkRun, whole_seconds
from harness.envoy import envoy_binary

NAME = "envoy"
RESULTS_FILE = "issue4-envoy.json"
CONNECTIONS = 16  # HTTP/1.1: one request in flight each
DURATION_S = 2.0  # wrk runs whole seconds; short runs, many rounds (the VM drifts)
ROUNDS = 4
WARM_UP_S = 1.0
SAMPLE_MARGIN_S = 0.3  # keep CPU samples clear of wrk's start and end
SERVICES = ("empty", "empty-4", "sidecar")


@dataclass(frozen=True, slots=True)
class Context:
    workdir: Path
    pinning: cpu.Pinning
    wrk: Wrk
    seconds: int
    rounds: int


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    envoy_s: float
    service_s: float
    wrk_s: float
    busy: dict[int, int]


def take_sample(stack: Stack, wrk_pid: int, pinning: cpu.Pinning) -> Sample:
    cpus = [c for c in (pinning.server_cpu, pinning.client_cpu) if c is not None]
    return Sample(
        time.monotonic(),
        cpu.cpu_seconds(stack.envoy.pid),
        cpu.cpu_seconds(stack.service.pid),
        cpu.cpu_seconds(wrk_pid),
        cpu.cpu_busy_ticks(cpus),
    )


def cpu_use(a: Sample, b: Sample, pinning: cpu.Pinning) -> CpuUse:
    wall = max(b.at - a.at, 1e-9)
    envoy, service = 100 * (b.envoy_s - a.envoy_s) / wall, 100 * (b.service_s - a.service_s) / wall
    other = None
    if pinning.server_cpu is not None:
        core = pinning.server_cpu
        busy = 100 * (b.busy[core] - a.busy[core]) / cpu.CLOCK_TICKS / wall
        other = max(0.0, busy - envoy - service)
    return CpuUse(wall, envoy, service, 100 * (b.wrk_s - a.wrk_s) / wall, other)


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def spec_for(kind: str, workdir: Path) -> ServerSpec:
    address = f"127.0.0.1:{free_port()}"
    if kind == "empty":
        return empty_spec(address)
    if kind == "empty-4":
        return empty_per_descriptor_spec(address)
    return sidecar_spec(address, workdir)


class Runner:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.runs: list[Run] = []

    def run(self) -> None:
        stacks: dict[str, Stack] = {}
        try:
            for kind in SERVICES:
                stacks[kind] = Stack(spec_for(kind, self.ctx.workdir), self.ctx.workdir, self._cpu)
                self._prepare(stacks[kind])
            for round_no in range(self.ctx.rounds):
                for kind in SERVICES if round_no % 2 == 0 else SERVICES[::-1]:
                    self._measure(round_no, stacks[kind])
        finally:
            for stack in stacks.values():
                stack.stop()

    @property
    def _cpu(self) -> int | None:
        return self.ctx.pinning.server_cpu

    def _prepare(self, stack: Stack) -> None:
        """A probe request, then unmeasured load so every stack is measured warm."""
        stack.check()
        self._start_wrk(stack, WARM_UP_S).finish()
        stack.pause()

    def _start_wrk(self, stack: Stack, seconds: float) -> WrkRun:
        prefix = cpu.pinned([], self.ctx.pinning.client_cpu)
        return self.ctx.wrk.start(stack.envoy.url + "/", CONNECTIONS, seconds, HEADERS, prefix)

    def _measure(self, round_no: int, stack: Stack) -> None:
        print(f"  round {round_no + 1}  {stack.name:<10}", end="", flush=True)
        stack.resume()
        try:
            run = self._timed_run(round_no, stack)
        finally:
            stack.pause()
        problems = "; ".join(run.problems())
        print(
            f" {run.wrk.rps:7,.0f} req/s  p99 {run.wrk.p99_ms:6.2f} ms  "
            f"envoy {run.cpu.envoy_pct:3.0f}% + service {run.cpu.service_pct:3.0f}% CPU"
            + (f"  INVALID: {problems}" if problems else "")
        )
        self.runs.append(run)

    def _samples(self, stack: Stack, wrk_pid: int) -> tuple[Sample, Sample]:
        """CPU use inside the run, clear of its start and end."""
        started, pinning = time.monotonic(), self.ctx.pinning
        _sleep_until(started + SAMPLE_MARGIN_S)
        first = take_sample(stack, wrk_pid, pinning)
        _sleep_until(started + self.ctx.seconds - SAMPLE_MARGIN_S)
        return first, take_sample(stack, wrk_pid, pinning)

    def _timed_run(self, round_no: int, stack: Stack) -> Run:
        pinning = self.ctx.pinning
        quiet = cpuwatch.wait_for_quiet(pinning, [*stack.pids, os.getpid()])
        before = stack.envoy.ratelimit_stats()
        wrk = self._start_wrk(stack, self.ctx.seconds)
        try:
            first, last = self._samples(stack, wrk.pid)
        except BaseException:
            wrk.kill()
            raise
        result = wrk.finish()
        after = stack.envoy.ratelimit_stats()
        deltas = {name: after[name] - before[name] for name in after}
        return Run(round_no, stack.name, result, deltas, cpu_use(first, last, pinning), quiet)


def version(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else None


def tool_versions() -> dict[str, str | None]:
    envoy = None if envoy_available() else version([str(envoy_binary()), "--version"])
    return {"wrk": version(["wrk", "-v"]), "envoy": envoy}


def unavailable(wrk: Wrk) -> str | None:
    return wrk.unavailable() or envoy_available()


def run(options: Options) -> Outcome:
    started = time.monotonic()
    pinning = cpu.choose_pinning()
    info = {**machine.describe(), **tool_versions()}
    cpu.pin_self(pinning.client_cpu)
    seconds = whole_seconds(options.duration_s or DURATION_S)
    rounds = options.rounds or ROUNDS
    print(f"[{NAME}] wrk → Envoy → {{{', '.join(SERVICES)}}}; pinning: {pinning.describe()}")
    with tempfile.TemporaryDirectory(prefix="rls-bench-envoy-") as tmp:
        wrk = Wrk(Path(tmp))
        reason = unavailable(wrk)
        runner = Runner(Context(Path(tmp), pinning, wrk, seconds, rounds))
        if reason is None:
            runner.run()
    elapsed = time.monotonic() - started
    report = Report(runner.runs, pinning, info, CONNECTIONS, seconds, rounds, elapsed, reason)
    print_report(report)
    path = write_results(options.results_dir / RESULTS_FILE, report)
    print(f"results: {path}")
    return Outcome(report.passed, path)

"""One measured load run against a server: probe, load, CPU accounting, interference check.

CPU use is sampled inside the measurement window (bench/cpuwatch.py); a run with too much
interference on the server's CPU is repeated once if time allows, and the least disturbed
attempt is kept. `pool` combines the runs of several rounds into one row.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench import cpu, cpuwatch
from bench.cpuwatch import CpuWindow
from bench.latency import LatencySummary, summarize
from bench.loadgen import Driver, LoadShape, Target, Workload
from bench.probe import probe
from bench.servers import ServerProcess

SAMPLE_MARGIN_S = 0.3  # keep CPU samples clear of start-up and wind-down
MAX_ATTEMPTS = 2
FINISH_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class RunContext:
    """What every run of a section shares: its shape, the CPU pinning, a scratch directory."""

    shape: LoadShape
    pinning: cpu.Pinning
    workdir: Path


@dataclass(slots=True)
class Measurement:
    workload: str
    client: str
    server: str
    requests: int
    duration_s: float
    errors: int
    first_error: str
    latencies_ms: list[float] = field(repr=False)
    cpu: CpuWindow
    probed: int
    attempts: int = 1
    runs: int = 1
    notes: list[str] = field(default_factory=list)

    @property
    def latency(self) -> LatencySummary:
        return summarize(self.latencies_ms)

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s

    @property
    def requests_per_cpu_second(self) -> float | None:
        """Throughput per second of server CPU: less sensitive to interference than RPS."""
        share = self.cpu.server_pct / 100.0
        return self.rps / share if share > 0 else None


def _sleep_until(moment: float) -> None:
    delay = moment - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def run_load(
    ctx: RunContext,
    server: ServerProcess,
    driver: Driver,
    workload: Workload,
    *,
    probe_first: bool = True,
) -> Measurement:
    """One attempt: correctness probe first (unless a failing server is expected, which cannot
    pass it), then the timed run with CPU sampling."""
    shape, pinning = ctx.shape, ctx.pinning
    probed = probe(server.address, workload.frames) if probe_first else 0
    target = Target("127.0.0.1", server.port)
    started = time.monotonic()
    run = driver.start(target, workload, shape, ctx.workdir, cpu.pinned([], pinning.client_cpu))
    window_start = started + shape.settle_s
    _sleep_until(window_start + SAMPLE_MARGIN_S)
    first = cpuwatch.snapshot(server.pid, run.pids, pinning)
    _sleep_until(window_start + shape.duration_s - SAMPLE_MARGIN_S)
    last = cpuwatch.snapshot(server.pid, run.pids, pinning)
    raw = run.finish(shape.settle_s + shape.duration_s + FINISH_GRACE_S)
    return Measurement(
        workload=workload.name,
        client=driver.name,
        server=server.spec.name,
        requests=raw.requests,
        duration_s=shape.duration_s,
        errors=raw.errors,
        first_error=raw.first_error,
        latencies_ms=raw.latencies_ms,
        cpu=cpuwatch.window(first, last, pinning),
        probed=probed,
        notes=list(raw.notes),
    )


def warm_up(
    ctx: RunContext, server: ServerProcess, driver: Driver, workload: Workload, seconds: float
) -> int:
    """Unmeasured load so both servers are measured warm (caches, allocator, key table).

    Returns the requests sent (0 if the driver does not say)."""
    brief = LoadShape(ctx.shape.connections, ctx.shape.streams, 0.0, seconds)
    target = Target("127.0.0.1", server.port)
    prefix = cpu.pinned([], ctx.pinning.client_cpu)
    run = driver.start(target, workload, brief, ctx.workdir, prefix)
    return run.finish(seconds + FINISH_GRACE_S).sent


def measure(
    ctx: RunContext, server: ServerProcess, driver: Driver, workload: Workload, deadline: float
) -> Measurement:
    """Up to MAX_ATTEMPTS runs while they are noisy and time allows; the least noisy is kept."""
    best: Measurement | None = None
    for attempt in range(1, MAX_ATTEMPTS + 1):
        quiet = cpuwatch.wait_for_quiet(ctx.pinning, [server.pid, os.getpid()])
        result = run_load(ctx, server, driver, workload)
        result.attempts = attempt
        if not quiet:
            result.notes.append("machine busy before the run")
        if best is None or _other(result) < _other(best):
            best = result
        best.attempts = attempt
        if not result.cpu.noisy or time.monotonic() > deadline:
            break
    assert best is not None
    return best


def _other(m: Measurement) -> float:
    other = m.cpu.other_on_server_cpu_pct
    return 0.0 if other is None else other


def pool(runs: Sequence[Measurement]) -> Measurement:
    """One row for several runs of the same workload, client and server (e.g. rounds)."""
    first = runs[0]
    errors = [r.first_error for r in runs if r.first_error]
    return Measurement(
        workload=first.workload,
        client=first.client,
        server=first.server,
        requests=sum(r.requests for r in runs),
        duration_s=sum(r.duration_s for r in runs),
        errors=sum(r.errors for r in runs),
        first_error=errors[0] if errors else "",
        latencies_ms=[x for r in runs for x in r.latencies_ms],
        cpu=cpuwatch.pooled_cpu([r.cpu for r in runs]),
        probed=sum(r.probed for r in runs),
        attempts=sum(r.attempts for r in runs),
        runs=len(runs),
        notes=sorted({n for r in runs for n in r.notes}),
    )

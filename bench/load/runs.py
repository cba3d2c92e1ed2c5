"""Measuring servers under load, the one way every load section does it.

A run: the load generator's correctness check, then load, CPU sampled inside the measured window.
A run with other work on the server CPU is repeated once while retry time lasts (the least
disturbed kept). Servers run side by side, the others stopped, in rounds of alternating order so
machine drift hits all alike; a comparison is the median over rounds of the ratio within a round.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

from bench.load import cpu
from bench.load.clients import Client, Latency, LoadShape, summarize
from bench.report import Options
from bench.workload import Workload

SAMPLE_MARGIN_S = 0.3
MAX_ATTEMPTS = 2
FINISH_GRACE_S = 30.0
SATURATED_PCT = 95.0  # servers at least this busy are CPU-bound: their RPS is their capacity
SHAPE = LoadShape(connections=10, streams=8, settle_s=0.5, duration_s=2.0)  # most sections'


class Server(Protocol):
    """A server under load: its processes by role (for the CPU accounting), counters read
    before and after each run, and SIGSTOP / SIGCONT for its turn."""

    name: str
    address: str

    def roles(self) -> dict[str, list[int]]: ...
    def counters(self) -> dict[str, int]: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def stop(self) -> None: ...


S = TypeVar("S", bound=Server)


@dataclass(frozen=True, slots=True)
class Bench:
    """What every run of a section shares."""

    shape: LoadShape
    pinning: cpu.Pinning
    workdir: Path
    retry_until: float  # time.monotonic(): noisy runs are repeated only before this
    rounds: int  # of alternating order, per workload
    skipped: list[str] = field(default_factory=list)  # what was not measured, and why

    def load(self, seconds: float) -> Bench:
        """The same, with `seconds` measured and no settle time."""
        return replace(self, shape=replace(self.shape, settle_s=0.0, duration_s=seconds))


@dataclass(slots=True)
class Run:
    """One timed run, or (`runs` > 1) several runs of one server, client and workload pooled."""

    workload: str
    client: str
    server: str
    round_no: int
    requests: int
    duration_s: float
    errors: int
    first_error: str
    latencies_ms: list[float] = field(repr=False)
    latency: Latency
    cpu: cpu.CpuWindow
    counters: dict[str, int]  # the server's counters: after the run minus before
    notes: list[str] = field(default_factory=list)
    attempts: int = 1
    runs: int = 1

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def per_cpu_second(self) -> float | None:
        """RPS per second of server CPU: a capacity estimate, less sensitive to interference."""
        share = self.cpu.server_pct / 100
        return self.rps / share if share > 0 else None

    def cpu_us(self, pct: float | None = None) -> float | None:
        """Server CPU time per request (or that of `pct`, one role's share), in µs."""
        used = self.cpu.server_pct if pct is None else pct
        return used / 100 / self.rps * 1e6 if self.rps > 0 else None


@contextmanager
def session(
    options: Options, retry_s: float, rounds: int, shape: LoadShape = SHAPE, *, pin: bool = True
) -> Iterator[Bench]:
    """A section's Bench (`--duration` and `--rounds` replacing its own) and scratch directory;
    pinned, this process and all it starts (Redis too) move to the load generators' CPU."""
    shape = replace(shape, duration_s=options.duration_s or shape.duration_s)
    pinning = cpu.choose_pinning(pin)
    pinning.pin_self()
    with tempfile.TemporaryDirectory(prefix="rls-bench-") as tmp:
        yield Bench(shape, pinning, Path(tmp), time.monotonic() + retry_s, options.rounds or rounds)


def usable(bench: Bench, clients: Sequence[Client], label: str = "") -> list[Client]:
    """The clients installed here; why each other one is not, added to the bench's skipped."""
    found = [client for client in clients if client.unavailable() is None]
    missing = [client for client in clients if client not in found]
    bench.skipped.extend(f"{label}{client.name}: {client.unavailable()}" for client in missing)
    return found


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def timed_run(
    bench: Bench,
    servers: Sequence[Server],
    client: Client,
    workload: Workload,
    *,
    check: bool = True,
) -> list[Run]:
    """One run of the servers at once, each loaded by its own `client` (in its own directory when
    several; their CPU not counted as other load); `check` False: no correctness check first."""
    for server in servers if check else ():
        client.check(server.address, workload)
    shape, before = bench.shape, [server.counters() for server in servers]
    prefix, loads = bench.pinning.taskset([], bench.pinning.client_cpus), []
    window_start = time.monotonic() + shape.settle_s
    for server in servers:
        workdir = bench.workdir / f"{client.name}-{server.name}" if servers[1:] else bench.workdir
        workdir.mkdir(exist_ok=True)
        loads.append(client.start(server.address, workload, shape, workdir, prefix))
    pids = [pid for load in loads for pid in load.pids]
    try:
        _sleep_until(window_start + SAMPLE_MARGIN_S)
        first = [cpu.snapshot(bench.pinning, server.roles(), pids) for server in servers]
        _sleep_until(window_start + shape.duration_s - SAMPLE_MARGIN_S)
        last = [cpu.snapshot(bench.pinning, server.roles(), pids) for server in servers]
    finally:
        raws = [load.finish(shape.settle_s + shape.duration_s + FINISH_GRACE_S) for load in loads]
    windows = [cpu.window(a, b, bench.pinning) for a, b in zip(first, last, strict=True)]
    busy = windows[0].other_on_server_cpu_pct + windows[0].server_pct
    other = max(0.0, busy - sum(window.server_pct for window in windows))
    found = []
    for server, raw, window, counted in zip(servers, raws, windows, before, strict=True):
        after = server.counters()
        found.append(Run(
            workload.name, client.name, server.name, 0, raw.requests,
            raw.duration_s or shape.duration_s, raw.errors, raw.first_error, raw.latencies_ms,
            raw.latency or summarize(raw.latencies_ms),
            replace(window, other_on_server_cpu_pct=other),
            {name: after[name] - counted.get(name, 0) for name in after},
        ))  # fmt: skip
    return found


def measure(bench: Bench, server: Server, client: Client, workload: Workload, round_no: int) -> Run:
    """Up to MAX_ATTEMPTS runs while they are noisy and retry time is left; the least noisy."""
    best: Run | None = None
    for attempt in range(1, MAX_ATTEMPTS + 1):
        own = [pid for pids in server.roles().values() for pid in pids] + [os.getpid()]
        quiet = cpu.wait_for_quiet(bench.pinning, own)
        run = timed_run(bench, [server], client, workload)[0]
        if not quiet:
            run.notes.append("machine busy before the run")
        if best is None or run.cpu.other_on_server_cpu_pct < best.cpu.other_on_server_cpu_pct:
            best = run
        best.round_no, best.attempts = round_no, attempt
        if not run.cpu.noisy or time.monotonic() > bench.retry_until:
            return best
    assert best is not None
    return best


def warm_up(
    bench: Bench, server: Server, client: Client, workload: Workload, seconds: float
) -> int:
    """Unmeasured load (caches, allocator, key table); the requests sent, 0 if not known."""
    prefix = bench.pinning.taskset([], bench.pinning.client_cpus)
    load = client.start(server.address, workload, bench.load(seconds).shape, bench.workdir, prefix)
    return load.finish(seconds + FINISH_GRACE_S).sent


def alternate(
    bench: Bench, servers: Sequence[Server], clients: Sequence[Client], workload: Workload
) -> list[Run]:
    """The bench's rounds; in each, every client against every server, in alternating order."""
    runs = []
    for round_no in range(bench.rounds):
        for client in clients:
            for server in servers if round_no % 2 == 0 else servers[::-1]:
                label = f"{workload.name:<14} {client.name:<11} {server.name:<9}"
                print(f"  round {round_no + 1}  {label}", end="", flush=True)
                server.resume()
                try:
                    run = measure(bench, server, client, workload, round_no)
                finally:
                    server.pause()
                tries = f"  (attempts: {run.attempts})" if run.attempts > 1 else ""
                print(f" {run.rps:7,.0f} req/s  p99 {run.latency.p99_ms:6.2f} ms  server CPU "
                      f"{run.cpu.server_pct:3.0f}%{tries}", flush=True)  # fmt: skip
                runs.append(run)
    return runs


@contextmanager
def started(starters: Sequence[Callable[[], S]], warm: Callable[[S], object]) -> Iterator[list[S]]:
    """Each server started, warmed up (`warm`) and paused; all stopped on leaving."""
    servers: list[S] = []
    try:
        for start in starters:
            servers.append(start())
            warm(servers[-1])
            servers[-1].pause()
        yield servers
    finally:
        for server in servers:
            server.stop()


def side_by_side(
    bench: Bench,
    starters: Sequence[Callable[[], S]],
    clients: Sequence[Client],
    workload: Workload,
    *,
    warm: float | Callable[[S], object],
) -> list[Run]:
    """The servers `started`, each warmed up by `warm` (seconds: by the first client), then
    `alternate`."""
    if not callable(warm):
        warm = partial(warm_up, bench, client=clients[0], workload=workload, seconds=warm)
    with started(starters, warm) as servers:
        return alternate(bench, servers, clients, workload)


def with_failures(measured: Sequence[Run], failed: Callable[[Run], tuple[int, str]]) -> list[Run]:
    """The runs, each with the failures `failed` finds in it (count, why) added to its errors:
    answers the load generator saw as OK that did not show the server at work."""
    marked = []
    for found in measured:
        count, why = failed(found)
        errors, first = found.errors + count, found.first_error or why
        marked.append(replace(found, errors=errors, first_error=first) if count else found)
    return marked


def pool(runs: Sequence[Run]) -> Run:
    """Requests and CPU over every run; latency percentiles over every request, or (a client
    that reports percentiles only) the median of the runs' percentiles."""
    first, errors = runs[0], [r.first_error for r in runs if r.first_error]
    latencies = [x for r in runs for x in r.latencies_ms]
    latency = summarize(latencies)
    if len(latencies) < sum(r.requests for r in runs):  # percentiles only
        p50 = statistics.median(r.latency.p50_ms for r in runs)
        p99 = statistics.median(r.latency.p99_ms for r in runs)
        latency = Latency(p50, p99, max(r.latency.max_ms for r in runs))
    counters = {k: sum(r.counters.get(k, 0) for r in runs) for k in first.counters}
    return Run(
        first.workload, first.client, first.server, -1, sum(r.requests for r in runs),
        sum(r.duration_s for r in runs), sum(r.errors for r in runs), errors[0] if errors else "",
        latencies, latency, cpu.pooled([r.cpu for r in runs]), counters,
        sorted({n for r in runs for n in r.notes}), sum(r.attempts for r in runs), len(runs),
    )  # fmt: skip


def rows(runs: Sequence[Run]) -> list[Run]:
    """One pooled row per (workload, client, server), in the order first measured."""
    groups: dict[tuple[str, str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.workload, run.client, run.server), []).append(run)
    return [pool(group) for group in groups.values()]


Value = Callable[[Run], float | None]  # what a ratio compares: RPS, RPS per CPU-second, p99


def ratios(
    runs: Sequence[Run], server: str, baseline: str, client: str, value: Value = lambda r: r.rps
) -> tuple[float, ...]:
    """`server`'s value over `baseline`'s, per round and workload in which `client` measured
    both."""
    by_round: dict[tuple[int, str], dict[str, Run]] = {}
    for run in runs:
        if run.client == client:
            by_round.setdefault((run.round_no, run.workload), {})[run.server] = run
    pairs = [(r.get(server), r.get(baseline)) for r in by_round.values()]
    found = [(value(s), value(b)) for s, b in pairs if s is not None and b is not None]
    return tuple(s / b for s, b in found if s is not None and b)


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None

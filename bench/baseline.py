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

import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import grpc

from bench import cpu, cpuwatch, machine
from bench.frames import frames_for, key_values, unframe
from bench.h2load_driver import H2loadDriver
from bench.latency import summarize
from bench.loadgen import Driver, LoadShape, Target, Workload
from bench.node_driver import NodeDriver
from bench.overhead_verdict import pooled
from bench.report import fmt, table, write_json
from bench.rls_load import FINISH_GRACE_S, Measurement, RunContext, measure, warm_up
from bench.section import Options, Outcome
from bench.servers import (
    ServerProcess,
    ServerSpec,
    empty_spec,
    free_port,
    sidecar_spec,
    start_server,
)
from ratelimit_sidecar import wire

ROOT = Path(__file__).resolve().parents[1]
NAME = "baseline"
RESULTS_FILE = "issue3-baseline.json"
SHAPE = LoadShape(connections=10, streams=8, settle_s=0.5, duration_s=2.0)
ROUNDS = 3
WARM_UP_S = 1.5
OUTAGE_S = 2.0  # each server's load run while Redis is hung or down (no settle time)
STALL_S = 1.0  # a single answer slower than this is a stall, even if it is an error
ANSWER_TIMEOUT_S = 10.0  # a single request's deadline: above redis-py's 5 s socket timeout
RETRY_BUDGET_S = 30.0  # noisy runs are repeated only in the section's first 30 s
MAX_KEYS = 10_000
TARGET_RATIO = 2.0
SERVERS = ("baseline", "sidecar")  # measured in this order in even rounds, reversed in odd
REFERENCE = "empty"  # bench/empty_server.py, with the primary client only: the stack's ceiling
OUTAGE_ORDER = ("sidecar", "baseline")


class RedisServer(Protocol):
    """What this section uses of tests/support/redis_servers.py's ServerProcess."""

    proc: subprocess.Popen[bytes] | None

    @property
    def url(self) -> str: ...

    def start(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def kill(self) -> None: ...


def _redis_servers() -> ModuleType:
    sys.path.insert(0, str(ROOT))
    from tests.support import redis_servers  # the same real server the tests start

    return redis_servers


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


@dataclass(frozen=True, slots=True)
class Answer:
    """One request as a gRPC client sees it: status (OK or the gRPC code) and time taken."""

    code: str
    seconds: float
    detail: str = ""

    def describe(self) -> str:
        took = f"{self.seconds * 1000:.1f} ms" if self.seconds < 1 else f"{self.seconds:.1f} s"
        return f"{self.code} in {took}"


def first_answer(address: str, frame: bytes) -> Answer:
    """One request on the connected, otherwise idle server (deadline ANSWER_TIMEOUT_S)."""
    with grpc.insecure_channel(address) as channel:
        grpc.channel_ready_future(channel).result(timeout=5.0)  # connecting is not timed
        call = channel.unary_unary(
            wire.METHOD_PATH,
            request_serializer=None,
            response_deserializer=wire.RateLimitResponse.FromString,
        )
        started = time.perf_counter()
        try:
            reply = call(unframe(frame), timeout=ANSWER_TIMEOUT_S)
        except grpc.RpcError as exc:
            return Answer(exc.code().name, time.perf_counter() - started, exc.details() or "")
        return Answer(wire.Code.Name(reply.overall_code), time.perf_counter() - started)


def _sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def outage_load(
    ctx: RunContext, server: ServerProcess, driver: Driver, workload: Workload
) -> Measurement:
    """rls_load.run_load without its up-front OK probe, which a failing server cannot pass."""
    shape, pinning = ctx.shape, ctx.pinning
    target = Target("127.0.0.1", server.port)
    started = time.monotonic()
    run = driver.start(target, workload, shape, ctx.workdir, cpu.pinned([], pinning.client_cpu))
    window = started + shape.settle_s
    _sleep_until(window + 0.3)
    first = cpuwatch.snapshot(server.pid, run.pids, pinning)
    _sleep_until(window + shape.duration_s - 0.3)
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
        probed=0,
        notes=list(raw.notes),
    )


@dataclass(frozen=True, slots=True)
class OutageRow:
    redis: str  # "hung", "down" or "restarted"
    server: str
    first: Answer
    load: Measurement | None  # None: no load run (restarted, or no Node client)

    @property
    def answering(self) -> bool:
        """Answered OK throughout: the single request and every request of the load run."""
        load_ok = self.load is None or (self.load.requests > 0 and self.load.errors == 0)
        return self.first.code == "OK" and load_ok

    @property
    def silent(self) -> bool:
        """The load run got no answer at all, neither OK nor error, in its window."""
        return self.load is not None and self.load.requests + self.load.errors == 0

    @property
    def behaviour(self) -> str:
        """One of "answers OK", "stalls" (slow or no answers) or "errors" (fast ones)."""
        if self.answering:
            return "answers OK"
        return "stalls" if self.silent or self.first.seconds >= STALL_S else "errors"

    def state(self) -> str:
        """The behaviour and what shows it."""
        if self.answering:
            return self.behaviour
        first, load, parts = self.first, self.load, []
        if load is not None and self.silent:
            parts.append(f"no answer within the {load.duration_s:g} s run")
        elif load is not None:
            parts.append(
                f"{load.errors:,} errors, {load.requests:,} OK in the {load.duration_s:g} s run"
            )
        if first.code != "OK":
            parts.append(f"a single request: {first.describe()}")
        return f"{self.behaviour}: {'; '.join(parts)}"


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


@dataclass(frozen=True, slots=True)
class Verdict:
    client: str
    ratio: float | None  # median over rounds of sidecar RPS / baseline RPS
    round_ratios: tuple[float, ...]
    ceiling: float | None  # the same for the empty handler: the most this stack allows
    p99_ms: tuple[float, float]  # sidecar, baseline (all rounds pooled)
    passed: bool | None
    summary: str


def _round_ratios(
    runs: Sequence[tuple[int, Measurement]], client: str, server: str = "sidecar"
) -> tuple[float, ...]:
    """`server` RPS / baseline RPS, per round in which both were measured with `client`."""
    by_round: dict[int, dict[str, Measurement]] = {}
    for round_no, run in runs:
        if run.client == client:
            by_round.setdefault(round_no, {})[run.server] = run
    pairs = [(r.get(server), r.get("baseline")) for r in by_round.values()]
    return tuple(s.rps / b.rps for s, b in pairs if s is not None and b is not None and b.rps)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def judge(runs: Sequence[tuple[int, Measurement]], client: str, primary: bool) -> Verdict:
    found = {r.server: r for r in pooled(runs) if r.client == client}
    sidecar, base = found.get("sidecar"), found.get("baseline")
    if sidecar is None or base is None:
        return Verdict(client, None, (), None, (0.0, 0.0), None, "NOT MEASURED")
    ratios = _round_ratios(runs, client)
    ratio, ceiling = _median(ratios), _median(_round_ratios(runs, client, REFERENCE))
    p99 = (sidecar.latency.p99_ms, base.latency.p99_ms)
    passed = ratio is not None and ratio >= TARGET_RATIO and p99[0] < p99[1]
    if sidecar.errors or base.errors:
        passed = False
    word = "PASS" if passed else "FAIL"
    summary = (
        f"{word}{'' if primary else ' (cross-check)'}: sidecar/baseline RPS = "
        f"{fmt(ratio, 2)}x (median of {len(ratios)} rounds; target >= {TARGET_RATIO:g}x); "
        f"p99 {p99[0]:.2f} ms vs {p99[1]:.2f} ms (target: lower)"
    )
    if ceiling is not None:
        summary += f"; the empty handler reaches {ceiling:.2f}x (this stack's ceiling)"
    if sidecar.errors or base.errors:
        summary += f"; failed requests: sidecar {sidecar.errors}, baseline {base.errors}"
    return Verdict(client, ratio, ratios, ceiling, p99, passed if primary else None, summary)


def outage_verdict(rows: Sequence[OutageRow], redis: str) -> tuple[bool | None, str]:
    found = {r.server: r for r in rows if r.redis == redis}
    sidecar, base = found.get("sidecar"), found.get("baseline")
    if sidecar is None or base is None:
        return None, f"Redis {redis}: NOT MEASURED"
    passed = sidecar.answering and not base.answering
    word = "PASS" if passed else "FAIL"
    return passed, f"Redis {redis}: {word}: sidecar {sidecar.state()}; baseline {base.state()}"


HEADER = (
    "client",
    "server",
    "RPS",
    "p50 ms",
    "p99 ms",
    "server CPU %",
    "CPU µs/req",
    "other CPU % s/c",
    "errors",
    "vs baseline",
)


def phase1_table(runs: Sequence[tuple[int, Measurement]], judged: Sequence[Verdict]) -> str:
    ratios = {(v.client, "sidecar"): v.ratio for v in judged}
    ratios |= {(v.client, REFERENCE): v.ceiling for v in judged}
    cells = []
    for row in pooled(runs):
        other = f"{fmt(row.cpu.other_on_server_cpu_pct)}/{fmt(row.cpu.other_on_client_cpu_pct)}"
        ratio = ratios.get((row.client, row.server))
        per_request = row.cpu.server_pct / 100 * 1e6 / row.rps if row.rps else None
        cells.append(
            [
                row.client,
                row.server,
                fmt(row.rps),
                fmt(row.latency.p50_ms, 2),
                fmt(row.latency.p99_ms, 2),
                fmt(row.cpu.server_pct),
                fmt(per_request),
                other,
                str(row.errors),
                "" if ratio is None else f"{ratio:.2f}x",
            ]
        )
    return table(HEADER, cells)


OUTAGE_HEADER = ("Redis", "server", "first request", "OK/s", "errors/s", "p99 ms", "state")


def outage_table(rows: Sequence[OutageRow]) -> str:
    cells = []
    for row in rows:
        load = row.load
        ok = errors = p99 = None
        if load is not None:
            ok, errors = load.rps, load.errors / load.duration_s
            p99 = summarize(load.latencies_ms).p99_ms
        cells.append(
            [
                row.redis,
                row.server,
                row.first.describe(),
                fmt(ok),
                fmt(errors),
                fmt(p99, 2),
                row.behaviour,
            ]
        )
    return table(OUTAGE_HEADER, cells)


def _notes(runs: Sequence[tuple[int, Measurement]], outages: Sequence[OutageRow]) -> list[str]:
    notes = []
    for row in pooled(runs):
        if row.cpu.noisy:
            notes.append(f"{row.client}/{row.server}: other load on the server CPU")
        if row.errors:
            notes.append(f"{row.client}/{row.server}: {row.errors} failed: {row.first_error}")
        notes += [f"{row.client}/{row.server}: {n}" for n in row.notes]
    for out in outages:
        if out.first.detail:
            notes.append(f"Redis {out.redis}, {out.server}: {out.first.detail}")
        if out.load is not None and out.load.first_error:
            notes.append(f"Redis {out.redis}, {out.server} load: {out.load.first_error}")
    return notes


def _row_json(row: Measurement) -> dict[str, Any]:
    return {
        "client": row.client,
        "server": row.server,
        "rps": row.rps,
        "requests": row.requests,
        "errors": row.errors,
        "first_error": row.first_error,
        "duration_s": row.duration_s,
        "latency_ms": asdict(row.latency),
        "cpu": {**asdict(row.cpu), "noisy": row.cpu.noisy},
        "runs": row.runs,
        "notes": row.notes,
    }


def _outage_json(row: OutageRow) -> dict[str, Any]:
    return {
        "redis": row.redis,
        "server": row.server,
        "first_request": asdict(row.first),
        "load": None if row.load is None else _row_json(row.load),
        "answering": row.answering,
        "state": row.state(),
    }


@dataclass(frozen=True, slots=True)
class Results:
    judged: list[Verdict]
    outage: list[tuple[bool | None, str]]
    skipped: list[str]
    elapsed_s: float

    @property
    def met(self) -> bool | None:
        found = [v.passed for v in self.judged if v.passed is not None]
        found += [passed for passed, _ in self.outage if passed is not None]
        return all(found) if found else None


def results(bench: Bench, skipped: list[str], elapsed_s: float) -> Results:
    clients = list(dict.fromkeys(r.client for _, r in bench.runs))
    judged = [judge(bench.runs, c, primary=i == 0) for i, c in enumerate(clients)]
    outage = [outage_verdict(bench.outages, redis) for redis in ("hung", "down")]
    return Results(judged, outage, skipped, elapsed_s)


LEGEND = """\
Redis up: RPS and latencies pool every round; vs baseline = median over rounds of RPS / the
baseline's RPS (same client, same round); empty = an empty grpc.aio handler on the same stack
(primary client only): no server on this stack can beat its RPS. CPU µs/req = server CPU time
per request; other CPU % s/c = work by anything else on the server's / the load generators' CPU
(Redis runs on the latter). Redis hung = SIGSTOP, down = SIGKILL:
first request = one request on the idle server (deadline {timeout:g} s); OK/s, errors/s and p99
from a {outage:g} s node-http2 run (every gRPC status checked) started with the outage."""


def render(bench: Bench, res: Results) -> str:
    shape = bench.ctx.shape
    lines = [
        f"ShouldRateLimit hot-10, {shape.connections} connections x {shape.streams} streams "
        f"({shape.in_flight} in flight); Redis up: {bench.rounds} rounds of {shape.duration_s:g}s"
        f" per row; pinning: {bench.ctx.pinning.describe()}, Redis on the load generators' CPU",
        phase1_table(bench.runs, res.judged),
        "",
        outage_table(bench.outages),
        LEGEND.format(timeout=ANSWER_TIMEOUT_S, outage=bench.outage_shape.duration_s),
    ]
    lines += [f"  note: {n}" for n in _notes(bench.runs, bench.outages)]
    lines += [f"  not measured: {s}" for s in res.skipped]
    lines += [v.summary for v in res.judged] + [text for _, text in res.outage]
    lines.append(f"section time: {res.elapsed_s:.0f}s")
    return "\n".join(lines)


def write_results(
    path: Path, bench: Bench, res: Results, text: str, machine_info: dict[str, Any]
) -> Path:
    document = {
        "section": NAME,
        "issue": 3,
        "target": (
            f"sidecar RPS >= {TARGET_RATIO:g}x the per-request-Redis baseline's and a lower p99;"
            " with Redis hung or down the sidecar answers OK while the baseline errors or stalls"
        ),
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": res.elapsed_s,
        "machine": machine_info,
        "pinning": {**asdict(bench.ctx.pinning), "description": bench.ctx.pinning.describe()},
        "shape": asdict(bench.ctx.shape),
        "outage_shape": asdict(bench.outage_shape),
        "report": text,
        "rows": [_row_json(r) for r in pooled(bench.runs)],
        "runs": [{"round": n + 1, **_row_json(r)} for n, r in bench.runs],
        "outages": [_outage_json(r) for r in bench.outages],
        "verdicts": [asdict(v) for v in res.judged],
        "outage_verdicts": [{"passed": p, "summary": s} for p, s in res.outage],
        "skipped": res.skipped,
        "met": res.met,
    }
    return write_json(path.name, document, path.parent)


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
    group = _redis_servers().ServerGroup(workdir / "redis")
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
    path = write_results(options.results_dir / RESULTS_FILE, bench, res, text, machine_info)
    print(f"results: {path}")
    return Outcome(res.met, path)

"""End to end, Envoy's Rate Limit Quota Service against the other ways through Envoy (issue #17).

Four stacks (rlqs_table.ABOUT), each an Envoy (`--concurrency 1`) and but for the plain one its
own service. One wrk per stack loads all four AT ONCE, every Envoy and service pinned to one core
and the wrks to the other: on a noisy machine that gives steadier ratios than alternating runs,
since a slowdown hits every stack of a round alike. A stack's capacity is what it serves per
second of its own CPU (rlqs_table.py).

A run is valid when wrk saw only 2xx and no socket errors, the RLS stack's Envoy counted no
failed or fail-open calls, and the RLQS stacks hold their stream open. Target: rlqs-sidecar
serves at least 95 % of rlqs-allow-all per core.
"""

from __future__ import annotations

import math
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import rlqs_table
from bench.envoy import API_KEY, DOMAIN, RULES_YAML, STATS_PREFIX, envoy_found
from bench.load import cpu, runs
from bench.load.clients import Load, LoadShape, Wrk
from bench.load.runs import Bench
from bench.load.servers import ServerProcess, start_service, start_sidecar
from bench.report import Options, Outcome, conclude, version
from bench.rlqs_envoy import PLAIN, RLQS, RLS, SERVICE_CLUSTER, BenchEnvoy
from bench.rlqs_table import ALLOW_ALL, STACKS, Sample
from bench.workload import Workload, rules_dir
from harness.envoy import envoy_binary

NAME = "rlqs"
CONNECTIONS = 8  # per stack; HTTP/1.1, one request in flight each
DURATION_S = 3
ROUNDS = 8
WARM_UP_S = 2  # the RLQS stacks' first report and assignment land in it
FINISH_GRACE_S = 30.0
SAMPLE_MARGIN_S = 0.3


@dataclass
class Stack:
    name: str
    envoy: BenchEnvoy
    service: ServerProcess | None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.envoy.port}"

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far: Envoy's, the service's."""
        service = self.service.pids if self.service else []
        return cpu.cpu_seconds([self.envoy.pid]), cpu.cpu_seconds(service)

    def check(self) -> None:
        """One request answered 200: the stack serves."""
        request = urllib.request.Request(f"http://{self.address}/", headers={"x-api-key": API_KEY})
        with urllib.request.urlopen(request, timeout=5) as reply:
            if reply.status != 200:
                raise RuntimeError(f"{self.name}: HTTP {reply.status}")

    def problems(self) -> list[str]:
        """Why this stack's runs do not show its filter at work (read after the runs)."""
        if self.name == rlqs_table.RLS:
            stats = self.envoy.stats(STATS_PREFIX)
            failed = stats.get(STATS_PREFIX + "error", 0)
            failed += stats.get(STATS_PREFIX + "failure_mode_allowed", 0)
            return [f"{failed} rate limit calls failed (Envoy failed open)"] if failed else []
        if self.name not in (ALLOW_ALL, rlqs_table.RLQS):
            return []
        # the stream is a request that never ends: one active while it is up
        if not self.envoy.stat(f"cluster.{SERVICE_CLUSTER}.upstream_rq_active"):
            return ["no RLQS stream open to the server"]
        return self.assignment_problems() if self.name == rlqs_table.RLQS else []

    def assignment_problems(self) -> list[str]:
        """The sidecar sent real token buckets, and its gateway refused nothing."""
        assert self.service is not None
        found = sidecar_metrics(self.service)
        buckets = found.get('rlqs_assignments_total{action="token_bucket"}', 0)
        denied = found.get('rlqs_requests_total{result="denied"}', 0)
        allowed = found.get('rlqs_requests_total{result="allowed"}', 0)
        problems = [] if buckets else ["the sidecar sent no token bucket assignment"]
        problems += [f"Envoy refused {denied:.0f} requests"] if denied else []
        return problems + ([] if allowed else ["no usage reported to the sidecar"])

    def stop(self) -> None:
        self.envoy.stop()
        if self.service:
            self.service.stop()


def sidecar_metrics(service: ServerProcess) -> dict[str, float]:
    """The sidecar's `ratelimit_sidecar_rlqs_*` samples, names without the prefix."""
    argv = [str(a) for a in service.proc.args]  # type: ignore[union-attr]
    address = argv[argv.index("--metrics-address") + 1]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    prefix, found = "ratelimit_sidecar_", {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith(prefix + "rlqs_"):
            found[name.removeprefix(prefix)] = float(value)
    return found


def start_stack(name: str, bench: Bench, rules: Path) -> Stack:
    workdir, pinning = bench.workdir, bench.pinning

    def on_server_cpu(argv: list[str]) -> list[str]:
        return pinning.taskset(argv, pinning.server_cpus)

    service: ServerProcess | None = None
    if name == ALLOW_ALL:
        service = start_service(workdir, pinning, "rlqs-allow")
    elif name != rlqs_table.PLAIN:
        service = start_sidecar(workdir, pinning, rules, name=name)
    kind = {rlqs_table.PLAIN: PLAIN, rlqs_table.RLS: RLS}.get(name, RLQS)
    port = int(service.address.rsplit(":", 1)[1]) if service else 0
    try:
        envoy = BenchEnvoy(workdir, f"envoy-{name}", kind, port, DOMAIN, on_server_cpu)
        envoy.wait_ready()
    except BaseException:
        if service:
            service.stop()
        raise
    return Stack(name, envoy, service)


def start_load(bench: Bench, stacks: Sequence[Stack], wrk: Wrk, seconds: int) -> list[Load]:
    shape = LoadShape(CONNECTIONS, 1, 0.0, seconds)
    prefix = bench.pinning.taskset([], bench.pinning.client_cpus)
    work = Workload("api-key", [])
    loads = []
    for stack in stacks:  # a directory each: wrk rewrites its script file at every start
        workdir = bench.workdir / f"wrk-{stack.name}"
        workdir.mkdir(exist_ok=True)
        loads.append(wrk.start(stack.address, work, shape, workdir, prefix))
    return loads


def snapshot(bench: Bench, stacks: Sequence[Stack]) -> tuple[float, int, list[tuple[float, float]]]:
    return time.monotonic(), cpu.busy_ticks(bench.pinning.server_cpus), [s.cpu() for s in stacks]


def measure_round(bench: Bench, stacks: Sequence[Stack], wrk: Wrk, round_no: int) -> list[Sample]:
    """Every stack loaded at once for DURATION_S; CPU sampled inside the window."""
    seconds = math.ceil(bench.shape.duration_s)
    started = time.monotonic()
    loads = start_load(bench, stacks, wrk, seconds)
    try:
        time.sleep(SAMPLE_MARGIN_S)
        t0, busy0, cpu0 = snapshot(bench, stacks)
        time.sleep(max(0.1, started + seconds - SAMPLE_MARGIN_S - time.monotonic()))
        t1, busy1, cpu1 = snapshot(bench, stacks)
    finally:
        raws = [load.finish(seconds + FINISH_GRACE_S) for load in loads]
    wall = t1 - t0
    used = [(e1 - e0, s1 - s0) for (e0, s0), (e1, s1) in zip(cpu0, cpu1, strict=True)]
    other = max(0.0, (busy1 - busy0) / cpu.CLOCK_TICKS - sum(e + s for e, s in used)) / wall
    samples = []
    for stack, raw, (envoy_s, service_s) in zip(stacks, raws, used, strict=True):
        cpu_shares = (envoy_s / wall, service_s / wall)
        measured = (raw.requests, raw.duration_s or seconds, *cpu_shares)
        samples.append(Sample(stack.name, round_no, *measured, raw.errors, raw.first_error, other))
    return samples


def print_round(samples: Sequence[Sample]) -> None:
    cells = "  ".join(
        f"{s.stack} {s.rps:7,.0f} req/s ({s.per_core or 0:7,.0f}/core)" for s in samples
    )
    print(
        f"  round {samples[0].round_no + 1}: {cells}  other {samples[0].other_cpu:.0%}", flush=True
    )


def measure(bench: Bench, wrk: Wrk, rounds: int) -> tuple[list[Sample], list[str]]:
    stacks: list[Stack] = []
    rules = rules_dir(bench.workdir, RULES_YAML, DOMAIN)
    try:
        for name in STACKS:
            stacks.append(start_stack(name, bench, rules))
            stacks[-1].check()
        warm = bench.load(WARM_UP_S)
        for load in start_load(warm, stacks, wrk, WARM_UP_S):
            load.finish(WARM_UP_S + FINISH_GRACE_S)
        samples: list[Sample] = []
        for round_no in range(rounds):
            samples += measure_round(bench, stacks, wrk, round_no)
            print_round(samples[-len(stacks) :])
        found = [f"{s.name}: {p}" for s in stacks for p in s.problems()]
        return samples, found
    finally:
        for stack in stacks:
            stack.stop()


def run(options: Options) -> Outcome:
    started, rounds, skipped = time.monotonic(), options.rounds or ROUNDS, list[str]()
    print(f"[{NAME}] wrk → {{{', '.join(STACKS)}}}, all loaded at once")
    wrk = Wrk({"x-api-key": API_KEY})
    found = runs.usable([wrk], skipped) and envoy_found(skipped)
    samples: list[Sample] = []
    problems: list[str] = []
    shape = LoadShape(CONNECTIONS, 1, 0.0, math.ceil(options.duration_s or DURATION_S))
    with runs.session(shape, 0.0) as bench:
        if found:
            samples, problems = measure(bench, wrk, rounds)
        pinning = bench.pinning.describe()
    problems += [
        f"{s.stack} round {s.round_no + 1}: {s.errors} failed requests ({s.first_error})"
        for s in samples
        if s.errors
    ]
    passed, text = rlqs_table.verdict(samples)
    if problems:
        passed, text = False, f"{text} — INVALID: {'; '.join(problems)}"
    lines = [
        f"\n{len(STACKS)} stacks at once, {CONNECTIONS} connections each, {rounds} rounds of "
        f"{shape.duration_s:g} s; pinning: {pinning}",
        *rlqs_table.render(samples),
        LEGEND,
        *[f"  {name}: {about}" for name, about in rlqs_table.ABOUT.items()],
        *[f"  not measured: {s}" for s in skipped],
        *[f"  note: {p}" for p in problems],
        text,
    ]
    document = {
        "pinning": pinning,
        "rounds": rounds,
        "duration_s": shape.duration_s,
        "connections_per_stack": CONNECTIONS,
        "samples": [asdict(s) for s in samples],
        "rows": [asdict(r) for r in rlqs_table.pooled(samples)],
        "problems": problems,
        "skipped": skipped,
        "sidecar_rules": RULES_YAML,
        "envoy": version([str(envoy_binary()), "--version"]) if found else None,
    }
    return conclude(options, NAME, started, lines, document, verdicts=[passed])


LEGEND = """\
RPS: requests per second while all four stacks shared one core (a share, not a capacity); RPS per
core: per second of the stack's own CPU (Envoy + service), its capacity on a core of its own;
Envoy µs/req, service ms/1k req: CPU per request of each; ratios: per round, then the median
and the range over rounds (target: rlqs-sidecar ≥ 95 % of rlqs-allow-all per core)."""

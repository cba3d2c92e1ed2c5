"""Strict rules against the per-request-Redis baseline, on the same stack and the same Redis.

The baseline is `bench per-request-redis`'s `limits` service (per descriptor one INCRBY + EXPIRE
call). Each sidecar runs the bench rule strict (`on_store_failure: deny`, so a failed check
cannot pass for a decision) for one algorithm: every request waits for one `strict.lua` call.
Hot-10 with h2load in alternating rounds; Redis on the load generators' core. A failed or
breaker-refused strict check (from /metrics) counts as a failed request.

Target: each strict sidecar at least the baseline's RPS and a p99 no worse (medians over rounds).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import redis

from bench import compare
from bench.algorithms import unreachable_limit
from bench.load import runs
from bench.load.clients import H2load, LoadShape
from bench.load.runs import Bench, Run
from bench.load.servers import ServerProcess, local_address, sidecar_args
from bench.per_request_redis import pin
from bench.report import Options, Outcome, conclude, fmt
from bench.workload import hot_10, rules_dir, rules_yaml
from harness.redis_servers import ServerGroup
from ratelimit_sidecar.config.model import AlgorithmName

NAME = "strict"
SHAPE = LoadShape(connections=10, streams=8, settle_s=0.5, duration_s=2.0)
ROUNDS = 4
WARM_UP_S = 1.5
RETRY_BUDGET_S = 60.0
MAX_KEYS = 10_000
TARGET_RATIO = 1.0
BASELINE = "limits"
STRICT_METRIC = 'ratelimit_sidecar_strict_checks_total{result="'
NOT_DECIDED = ("failed", "breaker_open")  # strict check results that are failed requests
STRICT_RESULTS = ("admitted", "over_limit", *NOT_DECIDED)
SCRIPT_CALLS, SCRIPT_USEC = "evalsha calls", "evalsha µs"


def strict_rule(algorithm: AlgorithmName) -> str:
    """The bench rule, strict, for `algorithm`, with a limit no run reaches (a sliding log's
    most: strict.lua keeps one member per admitted hit); a failed check refuses."""
    extra = f"algorithm: {algorithm.text}, consistency: strict, on_store_failure: deny"
    return rules_yaml(unreachable_limit(algorithm), extra)


class RedisClientServer(ServerProcess):
    """A server calling Redis per request; its counters add Redis's own EVALSHA statistics
    (calls, and µs spent running them), which both servers' calls are."""

    def __init__(
        self, name: str, args: list[str], address: str, bench: Bench, client: redis.Redis
    ) -> None:
        super().__init__(name, args, address, bench.workdir, bench.pinning)
        self.redis = client

    def counters(self) -> dict[str, int]:
        return script_counts(self.redis.info("commandstats"))


class StrictSidecar(RedisClientServer):
    """A sidecar with one strict rule; its counters add its strict checks by result."""

    def __init__(
        self, bench: Bench, algorithm: AlgorithmName, redis_url: str, client: redis.Redis
    ) -> None:
        home = bench.workdir / f"strict-{algorithm.text}"
        home.mkdir(exist_ok=True)
        rules = rules_dir(home, strict_rule(algorithm))
        address = local_address()
        args = sidecar_args(address, rules, "--max-keys", str(MAX_KEYS), "--redis-url", redis_url)
        self.metrics_url = f"http://{args[args.index('--metrics-address') + 1]}/metrics"
        super().__init__(f"strict {algorithm.text}", args, address, bench, client)

    def counters(self) -> dict[str, int]:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as reply:
            lines = reply.read().decode().splitlines()
        return {**strict_counts(lines), **super().counters()}


def start_baseline(bench: Bench, redis_url: str, client: redis.Redis) -> RedisClientServer:
    """`python -m bench.services limits` (what `start_service` starts), with Redis's counts."""
    address = local_address()
    args = ["bench.services", BASELINE, "--address", address, "--redis-url", redis_url]
    server = RedisClientServer(BASELINE, args, address, bench, client)
    server.wait_ready()
    return server


def script_counts(commandstats: dict[str, Any]) -> dict[str, int]:
    """EVALSHA calls and the µs Redis spent in them, from INFO commandstats."""
    found = commandstats.get("cmdstat_evalsha", {})
    return {SCRIPT_CALLS: int(found.get("calls", 0)), SCRIPT_USEC: int(found.get("usec", 0))}


def script_us(row: Run) -> float | None:
    """µs Redis spent per script call during the runs."""
    calls = row.counters.get(SCRIPT_CALLS, 0)
    return row.counters.get(SCRIPT_USEC, 0) / calls if calls else None


def strict_counts(lines: Sequence[str]) -> dict[str, int]:
    """Strict checks by result from Prometheus text lines."""
    found = {}
    for line in lines:
        if line.startswith(STRICT_METRIC):
            result, value = line[len(STRICT_METRIC) :].split('"', 1)
            found[result] = int(float(value.rsplit(" ", 1)[-1]))
    return found


def undecided(row: Run) -> int:
    """Strict checks that failed or were refused by the open breaker during the runs."""
    return sum(row.counters.get(result, 0) for result in NOT_DECIDED)


def measure(
    bench: Bench, redis_url: str, chosen: Sequence[AlgorithmName], rounds: int
) -> list[Run]:
    work, h2load = hot_10(), H2load()
    client = redis.Redis.from_url(redis_url)

    def sidecar(algorithm: AlgorithmName) -> RedisClientServer:
        server = StrictSidecar(bench, algorithm, redis_url, client)
        server.wait_ready()
        return server

    starters = [partial(start_baseline, bench, redis_url, client)]
    starters += [partial(sidecar, algorithm) for algorithm in chosen]
    warm = partial(runs.warm_up, bench, client=h2load, workload=work, seconds=WARM_UP_S)
    try:
        return runs.side_by_side(bench, starters, [h2load], work, rounds, warm=warm)
    finally:
        client.close()


def counted_failures(measured: Sequence[Run]) -> list[Run]:
    """The runs, each sidecar's failed strict checks added to its failed requests."""
    marked = []
    for measured_run in measured:
        lost, found = undecided(measured_run), measured_run
        if lost:
            reason = found.first_error or f"{lost} strict checks failed or breaker-refused"
            found = replace(found, errors=found.errors + lost, first_error=reason)
        marked.append(found)
    return marked


def run(options: Options) -> Outcome:
    started, rounds = time.monotonic(), options.rounds or ROUNDS
    print(f"[{NAME}] strict rules vs the per-request-Redis `limits` service, same Redis")
    chosen = list(AlgorithmName)
    skipped = list[str]()
    clients = runs.usable([H2load()], skipped)
    measured: list[Run] = []
    shape = replace(SHAPE, duration_s=options.duration_s or SHAPE.duration_s)
    with runs.session(shape, RETRY_BUDGET_S) as bench:
        group = ServerGroup(bench.workdir / "redis")
        try:
            store = group.standalone()
            pin(store, bench.pinning)
            if clients:
                measured = counted_failures(measure(bench, store.url, chosen, rounds))
        finally:
            group.stop_all()
    found = [
        compare.compare(measured, f"strict {a.text}", BASELINE, "hot-10", H2load.name)
        for a in chosen
    ]
    lines = runs.render(
        bench, measured, rounds, [("Redis µs/call", script_cell), ("strict checks", checks_cell)]
    )
    lines += ["", compare.comparison_table(found, TARGET_RATIO, p99_no_worse=True), LEGEND]
    lines += [f"  not measured: {s}" for s in skipped]
    document = runs.document(bench, measured, rounds, skipped)
    document["comparisons"] = [compare.as_json(c) for c in found]
    verdicts = [c.passed(TARGET_RATIO, p99_no_worse=True) for c in found]
    return conclude(options, NAME, started, lines, document, verdicts=verdicts)


def checks_cell(row: Run) -> str:
    found = {k: v for k, v in row.counters.items() if k in STRICT_RESULTS and v}
    return " ".join(f"{name} {count:,}" for name, count in sorted(found.items()))


def script_cell(row: Run) -> str:
    return fmt(script_us(row), 1)


LEGEND = """\
ratio = median over rounds of the strict sidecar's RPS / the `limits` service's in the same
round; p99 ratio = the same for p99 (target: <= 1). strict checks = the sidecar's strict checks
by result over every run (failed and breaker_open are counted as failed requests). Redis µs/call
= Redis's own time per EVALSHA (INFO commandstats: the `limits` INCRBY+EXPIRE script, or
strict.lua). Redis runs on the load generators' CPU."""

"""Strict rules against `bench per-request-redis`'s `limits` service (one INCRBY + EXPIRE per
descriptor), on the same stack and Redis (on the load generators' core). Each sidecar runs the
bench rule strict for one algorithm with `on_store_failure: deny` (a failed check cannot pass for
a decision): every request waits for one `strict.lua` call. Hot-10 with h2load in alternating
rounds; a failed or breaker-refused strict check (from /metrics) is a failed request.

Target: each strict sidecar at least the baseline's RPS and a p99 no worse (medians over rounds).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import redis

from bench import compare
from bench.algorithms import unreachable_limit
from bench.load import runs
from bench.load.clients import H2load
from bench.load.runs import Bench, Run
from bench.load.servers import ServerProcess, local_address, sidecar_args
from bench.per_request_redis import MAX_KEYS, WARM_UP_S, redis_session
from bench.report import Options, Outcome, conclude, fmt
from bench.workload import hot_10, rules_dir, rules_yaml
from ratelimit_sidecar.config.model import AlgorithmName

ROUNDS = 4
RETRY_BUDGET_S = 60.0
TARGET_RATIO = 1.0
BASELINE = "limits"
STRICT_METRIC = 'ratelimit_sidecar_strict_checks_total{result="'
NOT_DECIDED = ("failed", "breaker_open")  # strict check results that are failed requests
SCRIPT_CALLS, SCRIPT_USEC = "evalsha calls", "evalsha µs"


def strict_rule(algorithm: AlgorithmName) -> str:
    """The bench rule, strict, for `algorithm`, with a limit no run reaches (a sliding log's
    most: strict.lua keeps one member per admitted hit); a failed check refuses."""
    extra = f"algorithm: {algorithm.text}, consistency: strict, on_store_failure: deny"
    return rules_yaml(unreachable_limit(algorithm), extra)


class RedisClient(ServerProcess):
    """A server calling Redis per request. Its counters: Redis's own EVALSHA statistics (both
    servers' calls are scripts) and, for a sidecar, its strict checks by result."""

    def __init__(
        self, name: str, args: list[str], address: str, bench: Bench, client: redis.Redis
    ) -> None:
        self.redis = client
        super().__init__(name, args, address, bench)

    def counters(self) -> dict[str, int]:
        found = script_counts(self.redis.info("commandstats"))
        if self.metrics_url:
            found |= strict_counts(self.metrics(STRICT_METRIC))
        return found


def strict_sidecar(
    bench: Bench, redis_url: str, client: redis.Redis, algorithm: AlgorithmName
) -> RedisClient:
    rules, address = (
        rules_dir(bench.workdir, strict_rule(algorithm), algorithm.text),
        local_address(),
    )
    args = sidecar_args(address, rules, "--max-keys", str(MAX_KEYS), "--redis-url", redis_url)
    return RedisClient(f"strict {algorithm.text}", args, address, bench, client)


def strict_counts(found: Mapping[str, float]) -> dict[str, int]:
    """Strict checks by result, from the samples of STRICT_METRIC."""
    return {k.removesuffix('"}'): int(v) for k, v in found.items()}


def script_counts(commandstats: dict[str, Any]) -> dict[str, int]:
    """EVALSHA calls and the µs Redis spent in them, from INFO commandstats."""
    found = commandstats.get("cmdstat_evalsha", {})
    return {SCRIPT_CALLS: int(found.get("calls", 0)), SCRIPT_USEC: int(found.get("usec", 0))}


def script_us(row: Run) -> float | None:
    """µs Redis spent per script call during the runs."""
    calls = row.counters.get(SCRIPT_CALLS, 0)
    return row.counters.get(SCRIPT_USEC, 0) / calls if calls else None


def checks_cell(row: Run) -> str:
    found = {k: v for k, v in row.counters.items() if k not in (SCRIPT_CALLS, SCRIPT_USEC) and v}
    return " ".join(f"{name} {count:,}" for name, count in sorted(found.items()))


def undecided(row: Run) -> tuple[int, str]:
    """Strict checks that failed or were refused by the open breaker during the runs."""
    lost = sum(row.counters.get(result, 0) for result in NOT_DECIDED)
    return lost, f"{lost} strict checks failed or breaker-refused"


def measure(bench: Bench, redis_url: str) -> list[Run]:
    work, h2load, client = hot_10(), H2load(), redis.Redis.from_url(redis_url)
    address = local_address()
    baseline = ["bench.services", BASELINE, "--address", address, "--redis-url", redis_url]
    starters = [partial(RedisClient, BASELINE, baseline, address, bench, client)]
    starters += [partial(strict_sidecar, bench, redis_url, client, a) for a in AlgorithmName]
    try:
        return runs.side_by_side(bench, starters, [h2load], work, warm=WARM_UP_S)
    finally:
        client.close()


def run(options: Options) -> Outcome:
    measured: list[Run] = []
    with redis_session(options, RETRY_BUDGET_S, ROUNDS) as (bench, store):
        if runs.usable(bench, [H2load()]):
            measured = runs.with_failures(measure(bench, store.url), undecided)
    names = [f"strict {a.text}" for a in AlgorithmName]
    found = compare.against(measured, BASELINE, names, target=TARGET_RATIO, p99_no_worse=True)
    columns = [("Redis µs/call", lambda r: fmt(script_us(r), 1)), ("strict checks", checks_cell)]
    lines, document = compare.report(bench, measured, found, columns=columns, legend=LEGEND)
    return conclude(options, lines, document, compare.verdicts(found))


LEGEND = """\
strict checks = the sidecar's strict checks by result over every run (failed and breaker_open
are counted as failed requests). Redis µs/call = Redis's own time per EVALSHA (INFO
commandstats: the `limits` INCRBY+EXPIRE script, or strict.lua). Redis runs on the load
generators' CPU."""

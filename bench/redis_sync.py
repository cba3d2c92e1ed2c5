"""Issue #3: what the sync costs Redis, and what a tracked key costs memory.

Runs the real limiter core and the real Redis store against a real server started here:
* per span, at 1k / 10k / 100k active keys: round trips, Redis commands, sync duration
  (target: 100k keys synced in at most 25 % of a 10 s span);
* Redis commands per second at a request rate R and 2R over the same keys (target: equal
  within ±5 %): the sync cost follows the number of active keys, not the traffic;
* memory per tracked key with tracemalloc, counter state plus the handler's compiled request
  (target: at most 1 KiB).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.section import Options, Outcome
from harness.redis_servers import ServerGroup

NAME = "redis-sync"
KEY_COUNTS = (1_000, 10_000, 100_000)
SPAN_10S = {"window_s": 60, "spans": 6}  # a one-minute rule: 10 s spans


def limit(window_s: int, spans: int) -> Any:
    from ratelimit_sidecar.config.model import RateLimit, Rule, Unit

    rate = RateLimit(10**9, Unit.SECOND, unit_multiplier=window_s, spans=spans)
    return Rule("bench", (("client", ""),), rate)


def fill(limiter: Any, rule: Any, keys: int, now_ms: int, hits_per_key: int = 1) -> None:
    from ratelimit_sidecar.core import Hit

    for i in range(keys):
        limiter.hit(now_ms, [Hit(rule, ("bench", "client", f"user-{i:08d}"), hits_per_key)])


def commands(client: Any) -> int:
    return int(client.info("stats")["total_commands_processed"])


async def one_span(store: Any, client: Any, keys: int) -> dict[str, float]:
    """Sync `keys` active keys once; what it cost."""
    from ratelimit_sidecar.core import Limiter

    rule, limiter = limit(**SPAN_10S), Limiter(max_keys=keys + 1)
    now = int(time.time() * 1000) // 60_000 * 60_000  # both spans inside one window
    fill(limiter, rule, keys, now)
    batch = limiter.end_span(now + 10_000)  # the keys' first span: they are new
    limiter.apply_sync(now + 10_000, batch, await store.sync(batch))
    fill(limiter, rule, keys, now + 10_000)  # measured: a span of keys that stay active
    before_cmd, before_rt = commands(client), store.round_trips
    started = time.perf_counter()
    batch = limiter.end_span(now + 20_000)
    result = await store.sync(batch)
    limiter.apply_sync(now + 20_000, batch, result)
    seconds = time.perf_counter() - started
    return {
        "keys": keys,
        "round_trips": store.round_trips - before_rt,
        "redis_commands": commands(client) - before_cmd - 1,  # minus the INFO itself
        "sync_s": seconds,
        "share_of_10s_span": seconds / 10.0,
    }


async def command_rate(store: Any, client: Any, rate: int, keys: int = 1000) -> float:
    """Redis commands per second while `rate` requests/s hit `keys` keys (500 ms spans)."""
    from ratelimit_sidecar.core import Hit, Limiter
    from ratelimit_sidecar.server.syncloop import SyncLoop

    rule, limiter = limit(window_s=2, spans=4), Limiter()
    loop = SyncLoop(limiter, store, timeout_ms=1000)
    runner = asyncio.create_task(loop.run())
    fill(limiter, rule, keys, int(time.time() * 1000))
    await asyncio.sleep(1.0)  # every key active before measuring
    # Measure from the middle of a span for a whole number of spans (8 x 500 ms): every run
    # then holds exactly 8 span ends. An unaligned window holds 8 or 9, a 12 % difference
    # that is the phase of the clock, not the cost of the traffic.
    await asyncio.sleep((250 - time.time() * 1000 % 500) % 500 / 1000)
    before, started, sent = commands(client), time.perf_counter(), 0
    while (elapsed := time.perf_counter() - started) < 4.0:
        due = int(rate * elapsed) - sent
        now = int(time.time() * 1000)
        for i in range(due):
            limiter.hit(now, [Hit(rule, ("bench", "client", f"user-{(sent + i) % keys:08d}"), 1)])
        sent += due
        await asyncio.sleep(0.005)
    per_second = (commands(client) - before - 1) / (time.perf_counter() - started)
    loop.stop()
    await runner
    return per_second


def memory_per_key(keys: int = 100_000) -> float:
    """Bytes a tracked key costs the server: its counter state in the limiter plus the compiled
    request the handler keeps for it (request bytes, matched rule, counter name, metric slot)."""
    from harness.grpc_client import request
    from ratelimit_sidecar.core import Limiter
    from ratelimit_sidecar.metrics import Metrics
    from ratelimit_sidecar.service.ratelimit import RateLimitHandler

    rules = _rules_for_memory()
    now_ms = int(time.time() * 1000)
    handler = RateLimitHandler(
        rules, Limiter(max_keys=keys), lambda: now_ms, observer=Metrics(), cache_entries=keys
    )
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(keys):
        handler.decide(request("bench", [("client", f"user-{i:08d}")]).SerializeToString())
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(handler.limiter.keys) == keys
    return (after - before) / keys


def _rules_for_memory() -> Any:
    from ratelimit_sidecar.config.loader import load_rules

    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        path = Path(tmp) / "bench.yaml"
        path.write_text(
            "domain: bench\ndescriptors:\n  - key: client\n"
            "    rate_limit: {unit: minute, requests_per_unit: 1000000000}\n"
        )
        return load_rules(path)


async def measure(url: str, client: Any) -> dict[str, Any]:
    from ratelimit_sidecar.storage.redis_urls import open_redis

    store = open_redis(url + "?socket_timeout=10", "rls:", "bench")
    try:
        await one_span(store, client, 10)  # connects and loads the script: not a span's cost
        spans = [await one_span(store, client, keys) for keys in KEY_COUNTS]
        rates = {rate: await command_rate(store, client, rate) for rate in (500, 1000)}
    finally:
        await store.close()
    return {"spans": spans, "commands_per_s": rates}


def report(data: dict[str, Any]) -> tuple[str, bool]:
    lines = ["active keys  round trips/span  Redis commands/span  sync time  share of a 10 s span"]
    for row in data["spans"]:
        lines.append(
            f"{row['keys']:>11,}  {row['round_trips']:>16}  {row['redis_commands']:>19,}"
            f"  {row['sync_s'] * 1000:>7.0f} ms  {row['share_of_10s_span']:>19.1%}"
        )
    low, high = data["commands_per_s"][500], data["commands_per_s"][1000]
    change = high / low - 1
    lines.append(
        f"Redis commands/s over 1,000 keys: {low:,.0f} at 500 req/s, {high:,.0f} at 1,000 req/s"
        f" ({change:+.1%}; target ±5 %)"
    )
    lines.append(f"memory per tracked key: {data['bytes_per_key']:,.0f} bytes (target ≤ 1,024)")
    big = data["spans"][-1]
    met = (
        big["share_of_10s_span"] <= 0.25
        and abs(change) <= 0.05
        and data["bytes_per_key"] <= 1024
        and all(row["round_trips"] == 1 for row in data["spans"])
    )
    return "\n".join(lines), met


def run(options: Options) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as tmp:
        group = ServerGroup(Path(tmp))  # the same real server the tests start
        try:
            server = group.standalone()
            data = asyncio.run(measure(server.url, server.client()))
        finally:
            group.stop_all()
    data["bytes_per_key"] = memory_per_key()
    text, met = report(data)
    print(f"\n== {NAME}: Redis cost of the sync (issue #3) ==\n{text}\n")
    options.results_dir.mkdir(parents=True, exist_ok=True)
    out = options.results_dir / "issue3-redis-sync.json"
    out.write_text(json.dumps({**data, "table": text, "met": met}, indent=2, default=str))
    return Outcome(met, out)

"""What the background sync costs Redis, and what a tracked key costs memory; the real limiter and
sync loop against a real Redis:

* one span at 1k / 10k / 100k active keys: round trips, Redis commands, sync time (target: 100k
  keys in one round trip and at most 25 % of a 10 s span);
* Redis commands per second at R and 2R requests per second over the same keys (target: equal
  within ±5 %): the cost follows the active keys, not the traffic;
* long tail and hot keys on three sidecars against envoyproxy/ratelimit's per-request commands
  (sync_scenarios.py);
* memory per tracked key (tracemalloc: counter state and compiled request; target ≤ 1 KiB).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import tracemalloc
from functools import partial
from pathlib import Path
from typing import Any

import redis

from bench import sync_scenarios
from bench.report import Options, Outcome, conclude, table
from bench.workload import handler, request
from harness.answer import answer_now
from harness.redis_servers import server_group
from ratelimit_sidecar.config.model import RateLimit, Rule, Unit
from ratelimit_sidecar.core import FleetLimiter, Hit, Limiter
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.storage.redis_store import RedisStorage
from ratelimit_sidecar.storage.redis_urls import open_redis
from ratelimit_sidecar.sync.span_sync import SyncLoop

KEY_COUNTS = (1_000, 10_000, 100_000)
RATES = (500, 1_000)  # requests per second over RATE_KEYS keys
RATE_KEYS = 1_000
MEMORY_KEYS = 100_000
SPAN_S = 10  # a one-minute rule in six spans
MAX_SPAN_SHARE, MAX_RATE_CHANGE, MAX_BYTES_PER_KEY = 0.25, 0.05, 1024


def every_key_synced(keys: int, window_s: int, spans: int) -> tuple[FleetLimiter, Rule, list[str]]:
    """`keys` users of a rule of `spans` spans in `window_s`, on a limiter that holds no quiet
    key back (core/quiet_keys.py): the cost of syncing every key, as when all are near limits."""
    rate = RateLimit(10**9, Unit.SECOND, unit_multiplier=window_s, spans=spans)
    limits = FleetLimiter(keys + 1, quiet_share=0.0)
    return limits, Rule("bench", (("client", ""),), rate), users(keys)


def users(count: int) -> list[str]:
    return [f"user-{i:08d}" for i in range(count)]


def hit_all(limits: Limiter, counted: Rule, values: list[str], now_ms: int) -> None:
    for value in values:
        limits.hit(now_ms, [Hit(counted, ("bench", "client", value), 1)])


def commands(client: redis.Redis) -> int:
    return int(client.info("stats")["total_commands_processed"])


async def one_span(store: RedisStorage, client: redis.Redis, keys: int) -> dict[str, float]:
    """What syncing `keys` keys that stay active costs, in their second span."""
    now = [int(time.time() * 1000) // 60_000 * 60_000]  # both spans inside one window
    limits, counted, values = every_key_synced(keys, 60, 6)
    sync = SyncLoop(limits, store, lambda: now[0], timeout_ms=10_000)
    hit_all(limits, counted, values, now[0])
    now[0] += SPAN_S * 1000
    await sync.sync_once()  # the keys' first span: they are new
    hit_all(limits, counted, values, now[0])
    now[0] += SPAN_S * 1000
    before, round_trips, started = commands(client), store.round_trips, time.perf_counter()
    await sync.sync_once()
    seconds = time.perf_counter() - started
    return {
        "keys": keys,
        "round_trips": store.round_trips - round_trips,
        "redis_commands": commands(client) - before - 1,  # minus the INFO itself
        "sync_s": seconds,
        "share_of_span": seconds / SPAN_S,
    }


async def command_rate(store: RedisStorage, client: redis.Redis, rate: int) -> float:
    """Redis commands per second while `rate` requests/s hit RATE_KEYS keys (500 ms spans)."""
    limits, counted, values = every_key_synced(RATE_KEYS, 2, 4)
    sync = SyncLoop(limits, store, timeout_ms=1000)
    running = asyncio.create_task(sync.run())
    hit_all(limits, counted, values, int(time.time() * 1000))
    await asyncio.sleep(1.0)  # every key active before measuring
    # From the middle of a span for a whole number of spans (8 x 500 ms): every run holds
    # exactly 8 span ends. An unaligned window holds 8 or 9, a 12 % difference that is the
    # phase of the clock, not the cost of the traffic.
    await asyncio.sleep((250 - time.time() * 1000 % 500) % 500 / 1000)
    before, started, sent = commands(client), time.perf_counter(), 0
    while (elapsed := time.perf_counter() - started) < 4.0:
        due = int(rate * elapsed) - sent
        picked = [values[(sent + i) % RATE_KEYS] for i in range(due)]
        hit_all(limits, counted, picked, int(time.time() * 1000))
        sent += due
        await asyncio.sleep(0.005)
    per_second = (commands(client) - before - 1) / (time.perf_counter() - started)
    sync.stop()
    await running
    return per_second


def memory_per_key() -> float:
    """Bytes a tracked key costs the server: its counter state in the limiter plus the compiled
    request the handler keeps for it (request bytes, matched rule, counter name, metric slot)."""
    now_ms = int(time.time() * 1000)
    decide = partial(answer_now, handler(MEMORY_KEYS, lambda: now_ms, Metrics()))
    bodies = [request(v).SerializeToString() for v in users(MEMORY_KEYS)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for body in bodies:
        decide(body)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / MEMORY_KEYS


async def measure(url: str, client: redis.Redis) -> dict[str, Any]:
    store = open_redis(url + "?socket_timeout=10", "rls:", "bench")
    try:
        await one_span(store, client, 10)  # connects and loads the script: not a span's cost
        spans = [await one_span(store, client, keys) for keys in KEY_COUNTS]
        rates = {rate: await command_rate(store, client, rate) for rate in RATES}
    finally:
        await store.close()
    return {"spans": spans, "commands_per_s": rates}


def report(data: dict[str, Any]) -> tuple[str, bool]:
    header = ("active keys", "round trips/span", "Redis commands/span", "sync ms", "span share")
    rows = [
        [f"{span['keys']:,}", str(span["round_trips"]), f"{span['redis_commands']:,}",
         f"{span['sync_s'] * 1000:.0f}", f"{span['share_of_span']:.1%}"]
        for span in data["spans"]
    ]  # fmt: skip
    low, high = (data["commands_per_s"][rate] for rate in RATES)
    change, biggest = (high / low - 1 if low else float("inf")), data["spans"][-1]
    lines = [
        table(header, rows),
        f"span share = sync time / {SPAN_S} s; target: {biggest['keys']:,} keys in one round"
        f" trip and at most {MAX_SPAN_SHARE:.0%} of a span",
        f"Redis commands/s over {RATE_KEYS:,} keys: {low:,.0f} at {RATES[0]:,} req/s, "
        f"{high:,.0f} at {RATES[1]:,} req/s ({change:+.1%}; target ±{MAX_RATE_CHANGE:.0%})",
        f"memory per tracked key: {data['bytes_per_key']:,.0f} bytes"
        f" (target ≤ {MAX_BYTES_PER_KEY:,})",
    ]
    met = (
        biggest["share_of_span"] <= MAX_SPAN_SHARE
        and abs(change) <= MAX_RATE_CHANGE
        and data["bytes_per_key"] <= MAX_BYTES_PER_KEY
        and all(s["round_trips"] == 1 for s in data["spans"])
    )
    return "\n".join(lines), met


def run(options: Options) -> Outcome:
    with (
        tempfile.TemporaryDirectory(prefix="rls-bench-redis-") as tmp,
        server_group(Path(tmp)) as group,
    ):
        server = group.standalone()
        with server.client() as client:
            data = asyncio.run(measure(server.url, client))
        scenarios = [sync_scenarios.long_tail(), sync_scenarios.hot()]
        quiet = group.standalone("--hz", "1")  # sync_scenarios.py: a low floor
        data["scenarios"] = [sync_scenarios.measure(Path(tmp), quiet, s) for s in scenarios]
    data["bytes_per_key"] = memory_per_key()
    text, met = report(data)
    lines, scenarios_met = sync_scenarios.report(data["scenarios"])
    return conclude(options, [text, "", *lines], data, [met, scenarios_met])

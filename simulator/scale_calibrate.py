"""What each kind of store work costs a real Redis on this machine: the scale model's prices.

A Redis (or Valkey) is started on loopback and given each kind of work in bulk, through the
real store (`RedisStorage`, so the real codec and sync scripts) for the sidecar's kinds and
through a plain client for the per-request design's. For each kind: Redis CPU (INFO cpu, user
+ sys, less the server's own idle housekeeping over the same time), every command Redis ran
(total_commands_processed: it counts the commands inside scripts too), the commands the
client sent (from the codec's layout), and network bytes in and out (INFO stats).

Kinds (per unit):
  request      one pipelined INCRBY + EXPIRE round trip (the per-request design)
  incrby, expire   one command in a bulk pipeline
  entry_under  one sync-script entry with hits, under its limit
  entry_over   one entry with hits for a key over its limit (blocked)
  entry_read   one entry without hits (only read)
  get          one GET of a finished window's total, in a sync
  script_call  one sync's round trip and script call, without its entries (solved from syncs
               of 1 and of 1,000 entries)
  heartbeat    one sync carrying only the heartbeat
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import redis

from harness.redis_servers import server_group
from ratelimit_sidecar.config.model import RateLimit, Unit
from ratelimit_sidecar.core import SyncBatch, TotalRead
from ratelimit_sidecar.core.types import Push
from ratelimit_sidecar.storage.redis_store import RedisStorage
from ratelimit_sidecar.storage.redis_urls import open_redis

KEYS, ROUNDS, ROUND_TRIPS = 1000, 10, 2000
CALIBRATION_ROUNDS = 3
IDLE_S = 3.0
LIMIT = RateLimit(100, Unit.SECOND, unit_multiplier=60, spans=6)
Costs = dict[str, dict[str, float]]


class Meter:
    def __init__(self, admin: redis.Redis) -> None:
        self.admin = admin
        self.idle_cpu_per_s = 0.0

    def read(self) -> tuple[float, float, int, int, int]:
        info = self.admin.info("stats", "cpu")
        cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        ins, outs = int(info["total_net_input_bytes"]), int(info["total_net_output_bytes"])
        return time.monotonic(), cpu, int(info["total_commands_processed"]), ins, outs

    def learn_idle(self) -> None:
        a = self.read()
        time.sleep(IDLE_S)
        b = self.read()
        self.idle_cpu_per_s = (b[1] - a[1]) / (b[0] - a[0])

    async def per_unit(
        self, units: int, sent_per_unit: float, work: Callable[[], Awaitable[None]]
    ) -> dict[str, float]:
        a = self.read()
        await work()
        b = self.read()
        cpu_s = b[1] - a[1] - self.idle_cpu_per_s * (b[0] - a[0])
        return {
            "cpu_us": cpu_s * 1e6 / units,
            "commands": (b[2] - a[2] - 1) / units,  # less the INFO of `a`
            "client_commands": sent_per_unit,
            "bytes_in": (b[3] - a[3]) / units,
            "bytes_out": (b[4] - a[4]) / units,
        }


def keys(tag: str) -> list[tuple[str, ...]]:
    return [("scale", "user", f"{tag}{i}") for i in range(KEYS)]


def pushes(tag: str, hits: int, window: int) -> list[Push]:
    return [Push(key, window, hits, LIMIT) for key in keys(tag)]


async def syncs(store: RedisStorage, make: Callable[[], SyncBatch], count: int) -> None:
    for _ in range(count):
        await store.sync(make())


def sent(store: RedisStorage, batch: SyncBatch) -> int:
    return store.codec.encode(batch).layout.replies


async def measure_sidecar(meter: Meter, store: RedisStorage) -> Costs:
    now = int(time.time() * 1000)
    window = now // LIMIT.window_ms

    def batch(**parts: Any) -> Callable[[], SyncBatch]:
        return lambda: SyncBatch(now, heartbeat=False, **parts)

    async def per_unit(units: int, make: Callable[[], SyncBatch], count: int) -> dict[str, float]:
        return await meter.per_unit(units, sent(store, make()), partial(syncs, store, make, count))

    costs: Costs = {}
    beat = partial(SyncBatch, now, heartbeat=True)
    costs["heartbeat"] = await per_unit(ROUND_TRIPS, beat, ROUND_TRIPS)
    await store.sync(SyncBatch(now, pushes("o", LIMIT.requests_per_unit + 1, window)))
    one = await per_unit(ROUND_TRIPS, batch(pushes=pushes("u", 1, window)[:1]), ROUND_TRIPS)
    full = await per_unit(ROUNDS, batch(pushes=pushes("u", 1, window)), ROUNDS)
    costs["entry_under"] = mix(full, one, 1 / (KEYS - 1), -1 / (KEYS - 1))
    costs["script_call"] = mix(one, costs["entry_under"], 1, -1)
    kinds = {
        "entry_over": batch(pushes=pushes("o", 1, window)),
        "entry_read": batch(pushes=pushes("u", 0, window)),
    }
    for kind, make in kinds.items():
        measured = await per_unit(ROUNDS, make, ROUNDS)
        costs[kind] = mix(measured, costs["script_call"], 1 / KEYS, -1 / KEYS)
    reads = batch(total_reads=[TotalRead(key, window) for key in keys("u")])
    costs["get"] = mix(await per_unit(ROUNDS, reads, ROUNDS), {}, 1 / KEYS, 0)
    return costs


def mix(a: dict[str, float], b: dict[str, float], wa: float, wb: float) -> dict[str, float]:
    """wa * a + wb * b, figure by figure."""
    return {name: wa * a[name] + wb * b.get(name, 0.0) for name in a}


async def measure_per_request(meter: Meter, url: str) -> Costs:
    client = redis.Redis.from_url(url)
    client.ping()
    names = [f"scale_user_r{i}" for i in range(KEYS)]

    async def round_trips() -> None:
        for n in range(ROUND_TRIPS):
            name = names[n % KEYS]
            pipe = client.pipeline(transaction=False)
            pipe.incrby(name, 1)
            pipe.expire(name, 60)
            pipe.execute()

    async def bulk(command: str) -> None:
        for _ in range(ROUNDS):
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.incrby(name, 1) if command == "incrby" else pipe.expire(name, 60)
            pipe.execute()

    costs = {"request": await meter.per_unit(ROUND_TRIPS, 2, round_trips)}
    for command in ("incrby", "expire"):
        costs[command] = await meter.per_unit(ROUNDS * KEYS, 1, partial(bulk, command))
    client.close()
    return costs


async def measure_all(url: str, admin: redis.Redis) -> Costs:
    meter = Meter(admin)
    meter.learn_idle()
    store = open_redis(url + "?socket_timeout=10", "rls:", "calibration")
    try:
        await store.sync(SyncBatch(int(time.time() * 1000)))  # connects, loads the scripts
        costs = await measure_sidecar(meter, store)
    finally:
        await store.close()
    costs.update(await measure_per_request(meter, url))
    costs["redis"] = {"idle_cpu_us_per_s": meter.idle_cpu_per_s * 1e6}
    return costs


def calibrate(rounds: int = CALIBRATION_ROUNDS) -> Costs:
    """Start a Redis on loopback, measure every kind `rounds` times, stop it; each figure is
    the median of its rounds (another load on the machine inflates a round, never deflates)."""
    with tempfile.TemporaryDirectory(prefix="rls-scale-") as tmp, server_group(Path(tmp)) as group:
        server = group.standalone()
        with server.client() as admin:
            version = admin.info("server")
            runs = [asyncio.run(measure_all(server.url, admin)) for _ in range(rounds)]
    costs = {
        kind: {name: statistics.median(run[kind][name] for run in runs) for name in figures}
        for kind, figures in runs[0].items()
    }
    name = "valkey" if "valkey_version" in version else "redis"
    costs["redis"]["version"] = f"{name} {version.get(f'{name}_version')}"  # type: ignore[assignment]
    return costs

"""A flood of fresh descriptor values against a few heavy clients: are they held to their limit?
A tester's reset attempt: `--max-keys 50000`, 300,000 random `api_key` values at about 2,700/s,
five heavy clients at 2/s against 60 a minute. Target: every heavy client admitted at most 63
(x 1.05) in every whole minute, local-only (in-process, fake clock) and with Redis (real clock,
about two minutes), the key table bounded.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench.report import Options, Outcome, conclude, passing, table
from bench.workload import request, rules_dir, rules_yaml
from harness.answer import answer_now
from harness.redis_servers import server_group
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.app.sidecar import Sidecar
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.core import LocalLimiter
from ratelimit_sidecar.service.ratelimit import RateLimitHandler
from ratelimit_sidecar.storage.redis_urls import open_redis

LIMIT, MAX_KEYS, FLOOD, FLOOD_RPS, HEAVY, HEAVY_RPS = 60, 50_000, 300_000, 2_700, 5, 2
TARGET = LIMIT * 1.05
RULES = rules_yaml(LIMIT, domain="gateway", key="api_key", unit="minute")
TICK_MS = 10  # requests are sent in ticks: 27 flood requests, and heavy ones every 500 ms
Decide = Callable[[bytes], bytes]
Admitted = Counter[tuple[str, int]]  # (heavy client, minute) -> admitted


def body(value: str) -> bytes:
    return request(value, "gateway", "api_key").SerializeToString()


class Flood:
    """The traffic, one tick at a time; counts the heavy clients' admissions per minute."""

    def __init__(self) -> None:
        self.rng, self.sent, self.admitted = random.Random(7), 0, Admitted()
        self.heavy = [body(f"heavy{i}") for i in range(HEAVY)]
        self.next_heavy = 0

    @property
    def done(self) -> bool:
        return self.sent >= FLOOD

    def tick(self, decide: Decide, now_ms: int) -> None:
        for _ in range(FLOOD_RPS * TICK_MS // 1000):
            decide(body(f"k{self.rng.getrandbits(64):x}"))
            self.sent += 1
        if now_ms >= self.next_heavy:
            self.next_heavy = max(self.next_heavy, now_ms - TICK_MS) + 1000 // HEAVY_RPS
            for i, raw in enumerate(self.heavy):
                answer = wire.RateLimitResponse.FromString(decide(raw))
                ok = answer.overall_code == wire.Code.OK
                self.admitted[f"heavy{i}", now_ms // 60_000] += ok


def local_only(rules_path: Path) -> tuple[Admitted, int]:
    now = [int(time.time() * 1000) // 60_000 * 60_000]
    limiter = LocalLimiter(MAX_KEYS)
    handler = RateLimitHandler(load_rules(rules_path), limiter, lambda: now[0])
    flood = Flood()
    while not flood.done:
        flood.tick(partial(answer_now, handler), now[0])
        now[0] += TICK_MS
    return flood.admitted, len(limiter.keys)


async def with_redis(rules_path: Path, url: str) -> tuple[Admitted, int]:
    settings = Settings(config_path=str(rules_path), grpc_address="127.0.0.1:0",
                        metrics_address="127.0.0.1:0", max_keys=MAX_KEYS)  # fmt: skip
    store = open_redis(url, f"flood{uuid.uuid4().hex[:6]}:", "flood-node")
    sidecar = Sidecar(settings, load_rules(rules_path), store)
    await sidecar.startup()
    flood, started = Flood(), time.monotonic()
    try:
        while not flood.done:
            now = sidecar.clock.now_ms()
            flood.tick(partial(answer_now, sidecar.handler), now)
            lag = started + flood.sent / FLOOD_RPS - time.monotonic()
            await asyncio.sleep(max(0.0, lag))
    finally:
        await sidecar.shutdown()
    return flood.admitted, len(sidecar.limiter.keys)


def per_minute(admitted: Admitted) -> dict[str, list[int]]:
    """Per heavy client, its admissions in each minute of the run (the first and last may be
    partial: fewer requests, never more admitted than a whole minute may)."""
    minutes = sorted({m for _, m in admitted})
    return {f"heavy{i}": [admitted[f"heavy{i}", m] for m in minutes] for i in range(HEAVY)}


def run(options: Options) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="rls-bench-flood-") as tmp:
        rules_path = rules_dir(Path(tmp), RULES, "gateway")
        modes = {"local-only": local_only(rules_path)}
        with server_group(Path(tmp) / "redis") as group:
            modes["redis"] = asyncio.run(with_redis(rules_path, group.standalone().url))
    rows, verdicts, document = [], [], {}
    for mode, (admitted, tracked) in modes.items():
        minutes = per_minute(admitted)
        worst = max((max(counts) for counts in minutes.values() if counts), default=0)
        held = worst > 0 and worst <= TARGET and tracked <= MAX_KEYS
        verdicts.append(held)
        counts = " | ".join(" ".join(str(c) for c in counts) for counts in minutes.values())
        rows.append([mode, counts, str(worst), f"{tracked:,}", passing(held)])
        document[mode] = {"per_minute": minutes, "worst": worst, "tracked_keys": tracked}
    header = ["mode", "heavy clients' admitted per minute", "worst", "tracked keys", "≤ 63"]
    lines = [f"{FLOOD:,} fresh values at {FLOOD_RPS:,}/s, {HEAVY} clients at "
             f"{HEAVY_RPS}/s against {LIMIT}/min, --max-keys {MAX_KEYS:,}",
             table(header, rows, left=2)]  # fmt: skip
    return conclude(options, lines, document, verdicts)

"""What one decision costs in-process, by how often the sidecar has seen the request before.

The load runs measure RPS through gRPC, where the steady state counts: a repeated request (hot
key) and 100,000 clients that keep coming back. This times `RateLimitHandler.decide` alone for
those, and for the case the load runs leave out on purpose: a request never seen before
(parse, validate, match, a new counter, a cache entry), the cost of a flood of fresh values,
also with a key table too small for the flood, where each new counter evicts an idle one.
A loop keeps the CPU caches warmer than a busy server does, so these are lower bounds.
"""

from __future__ import annotations

import gc
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.frames import RULES_YAML, key_values, request
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.core import Limiter
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.service.ratelimit import RateLimitHandler

DISTINCT = 100_000
HOT_KEYS = 10
HOT_CALLS = 100_000
FULL_TABLE_SHARE = 2  # the flood row's --max-keys: this fraction of its new requests
CLOCK_STEP_MS = 0.1  # a decision every 0.1 ms of the fake clock: 10,000 requests per second


@dataclass(frozen=True, slots=True)
class DecideCost:
    case: str
    us_per_decision: float


class _Clock:
    """Advances by CLOCK_STEP_MS per read: windows and spans roll as at 10,000 RPS."""

    def __init__(self) -> None:
        self.now = time.time() * 1000

    def __call__(self) -> int:
        self.now += CLOCK_STEP_MS
        return int(self.now)


def _handler(max_keys: int = 2 * DISTINCT) -> RateLimitHandler:
    with tempfile.TemporaryDirectory(prefix="rls-bench-decide-") as tmp:
        (Path(tmp) / "bench.yaml").write_text(RULES_YAML)
        rules = load_rules(Path(tmp))
    limiter = Limiter(max_keys=max_keys, shared_store=False)  # as `serve` without Redis
    return RateLimitHandler(
        rules, limiter, _Clock(), observer=Metrics(), cache_entries=2 * DISTINCT
    )


def _us_per_call(decide: Callable[[bytes], bytes], bodies: Sequence[bytes]) -> float:
    started = time.perf_counter()
    for body in bodies:
        decide(body)
    return (time.perf_counter() - started) / len(bodies) * 1e6


def measure() -> list[DecideCost]:
    handler = _handler()
    distinct = [request(v).SerializeToString() for v in key_values(DISTINCT)]
    hot = distinct[:HOT_KEYS] * (HOT_CALLS // HOT_KEYS)
    small_table = DISTINCT // FULL_TABLE_SHARE
    gc.collect()
    gc.freeze()  # as the server does after startup
    try:
        first = _us_per_call(handler.decide, distinct)
        again = _us_per_call(handler.decide, distinct)
        repeated = _us_per_call(handler.decide, hot)
        # A key table half the flood: the second half of the new keys each evict an idle one.
        full = _us_per_call(_handler(small_table).decide, distinct)
    finally:
        gc.unfreeze()
    return [
        DecideCost(f"first sight ({DISTINCT:,} new requests)", first),
        DecideCost(f"seen before ({DISTINCT:,} requests, each again)", again),
        DecideCost(f"repeated ({HOT_KEYS} requests, {HOT_CALLS:,} calls)", repeated),
        DecideCost(f"first sight, half evicting (--max-keys {small_table:,})", full),
    ]


def describe(costs: Sequence[DecideCost]) -> list[str]:
    lines = ["In-process RateLimitHandler.decide with metrics (bench/decide_cost.py):"]
    lines += [f"  {c.case:<45} {c.us_per_decision:6.2f} µs" for c in costs]
    return lines

"""The fleet at internet scale: what the shared store does for N gateways, against the
per-request design (one INCRBY + EXPIRE per request).

Requests go to a population of keys with Zipf popularity (exponent `zipf`), spread evenly over
the gateways; the population is as large as makes each gateway see `keys_per_gateway`
distinct keys per window. Ranks are grouped in bins of keys with about the same rate. What a
key costs is not derived here: `scale_keys.py` runs the real core for key classes on a grid of
rates per gateway, and each bin takes the cost of its rate from that grid (linear between two
classes, proportional below the quietest). What a gateway costs whatever its keys (syncs,
heartbeats) comes from the real schedule.
Per-command Redis CPU and bytes come from a calibration against a real Redis
(`scale_calibrate.py`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ratelimit_sidecar.core import SyncSchedule
from ratelimit_sidecar.core.schedule import BEAT_MS
from ratelimit_sidecar.storage.codec import CHUNK_KEYS
from simulator.scale_keys import KeyCost, KeyLoad, key_cost

SINGLE_RANKS = 100  # ranks binned one by one; geometric bins after
BIN_RATIO = 1.05
CLASSES_PER_DECADE = 4
SHARD_BUDGET = 0.70  # of one core: the Redis CPU a shard is planned to carry
ENTRY_KINDS = ("under", "over", "read")


@dataclass(frozen=True, slots=True)
class Case:
    gateways: int
    keys_per_gateway: int = 40_000
    rate_per_gateway: float = 1_000.0  # requests/s
    zipf: float = 0.9
    limit: int = 100
    window_ms: int = 60_000
    spans: int = 6


@dataclass(frozen=True, slots=True)
class Bin:
    keys: int
    share: float  # of all requests, per key of the bin


def mean_power(first: int, end: int, exponent: float) -> float:
    """The mean of r**-exponent over the integer ranks first..end-1."""
    if end - first == 1:
        return float(first**-exponent)
    a, b = first - 0.5, end - 0.5
    if exponent == 1:
        return math.log(b / a) / (end - first)
    return float(a ** (1 - exponent) - b ** (1 - exponent)) / (exponent - 1) / (end - first)


def zipf_bins(population: int, exponent: float) -> list[Bin]:
    edges = list(range(1, min(SINGLE_RANKS, population) + 1))
    while edges[-1] <= population:
        edges.append(max(edges[-1] + 1, math.ceil(edges[-1] * BIN_RATIO)))
    edges[-1] = population + 1
    raw = [(b - a, mean_power(a, b, exponent)) for a, b in itertools.pairwise(edges)]
    norm = sum(keys * weight for keys, weight in raw)
    return [Bin(keys, weight / norm) for keys, weight in raw]


def active_keys(bins: list[Bin], case: Case) -> float:
    """Distinct keys one gateway sees in a window (Poisson arrivals)."""
    per_window = case.rate_per_gateway * case.window_ms / 1000
    return sum(b.keys * -math.expm1(-per_window * b.share) for b in bins)


def population(case: Case) -> int:
    """The key population that makes each gateway see `keys_per_gateway` keys per window."""
    if case.keys_per_gateway >= case.rate_per_gateway * case.window_ms / 1000:
        raise ValueError("more active keys per gateway than requests per window")
    low, high = case.keys_per_gateway, case.keys_per_gateway * 10
    while active_keys(zipf_bins(high, case.zipf), case) < case.keys_per_gateway:
        low, high = high, high * 10
    while high - low > max(1, low // 200):
        middle = (low + high) // 2
        seen = active_keys(zipf_bins(middle, case.zipf), case)
        low, high = (middle, high) if seen < case.keys_per_gateway else (low, middle)
    return high


def class_rates(low: float, high: float) -> list[float]:
    first = math.floor(math.log10(low) * CLASSES_PER_DECADE)
    last = math.ceil(math.log10(high) * CLASSES_PER_DECADE)
    return [10 ** (i / CLASSES_PER_DECADE) for i in range(first, last + 1)]


def interpolated(rate: float, grid: list[tuple[float, KeyCost]]) -> KeyCost:
    """A key's cost per window at `rate`: linear between grid classes, proportional below."""
    if rate <= grid[0][0]:
        return grid[0][1].scaled(rate / grid[0][0])
    for (x0, c0), (x1, c1) in itertools.pairwise(grid):
        if rate <= x1:
            t = (rate - x0) / (x1 - x0)
            return sum_costs([(c0, 1 - t), (c1, t)])
    return grid[-1][1]


def sum_costs(parts: list[tuple[KeyCost, float]]) -> KeyCost:
    total = KeyCost()
    for cost, weight in parts:
        part = cost.scaled(weight)
        for kind in ENTRY_KINDS:
            total.entries[kind] += part.entries[kind]
        total.gets += part.gets
        total.syncs_with_work += part.syncs_with_work
        total.offered += part.offered
        total.admitted += part.admitted
        total.over_admitted += part.over_admitted
        total.refused_under += part.refused_under
    return total


def heartbeats_per_s(case: Case, seconds: int = 600) -> float:
    """How often one busy gateway's syncs carry the heartbeat: its loop wakes at every span end
    and at least every HEARTBEAT_MS, and the real schedule says which wake-ups beat (it is
    told the span of the rule, the gateway's shortest)."""
    # Started a heartbeat period before: the steady rate, past a node's first beats each second.
    schedule, now, end, beats = SyncSchedule(-BEAT_MS), 0, seconds * 1000, 0
    span_ms = case.window_ms // case.spans
    while now < end:
        beats += schedule.heartbeat_due(now, span_ms)
        schedule.synced(now)
        now = schedule.next_sync((now // span_ms + 1) * span_ms)
    return beats * 1000 / end


@dataclass(frozen=True, slots=True)
class Load:
    """One design's store work for a whole fleet, per second."""

    units: dict[str, float]  # calibrated kinds of work per second
    offered: float
    admitted: float
    over_admitted: float  # admitted beyond a key's limit in its window
    refused_under: float  # refused while the key's window stayed within its limit

    def price(self, costs: dict[str, dict[str, float]], figure: str) -> float:
        return sum(n * costs[kind][figure] for kind, n in self.units.items())


def sidecar_load(case: Case, seed: int = 1) -> Load:
    """The sidecars' work: every key bin at its rate, and every gateway's syncs."""
    bins = zipf_bins(population(case), case.zipf)
    rates = [case.rate_per_gateway * b.share for b in bins]
    grid = [
        (rate, key_cost(KeyLoad(case.gateways, rate, case.limit, case.window_ms, case.spans), seed))
        for rate in class_rates(min(rates), max(rates))
    ]
    per_window = sum_costs(
        [(interpolated(r, grid), b.keys) for b, r in zip(bins, rates, strict=True)]
    )
    per_s = 1000 / case.window_ms
    units = {f"entry_{kind}": n * per_s for kind, n in per_window.entries.items()}
    units["get"] = per_window.gets * per_s
    units["script_call"] = script_calls(case, sum(per_window.entries.values()) * per_s)
    units["heartbeat"] = case.gateways * heartbeats_per_s(case)
    return Load(
        units,
        per_window.offered * per_s,
        per_window.admitted * per_s,
        per_window.over_admitted * per_s,
        per_window.refused_under * per_s,
    )


def script_calls(case: Case, entries_per_s: float) -> float:
    """Sync-script calls (each a round trip of its sync) per second: per gateway and span end,
    one per CHUNK_KEYS entries (at least one when the span has any); quieter gateways make one
    per entry."""
    spans_per_s = case.spans * 1000 / case.window_ms
    per_span = entries_per_s / case.gateways / spans_per_s
    if per_span < 1:
        return entries_per_s
    return case.gateways * spans_per_s * math.ceil(per_span / CHUNK_KEYS)


def per_request_load(case: Case) -> Load:
    """One INCRBY + EXPIRE round trip per request; a counter read before each decision
    admits exactly the limit."""
    requests = case.gateways * case.rate_per_gateway
    return Load({"request": requests}, requests, requests, 0.0, 0.0)


def shards(cpu_cores: float) -> int:
    """Redis Cluster shards to carry `cpu_cores` of Redis CPU at SHARD_BUDGET each."""
    return max(1, math.ceil(cpu_cores / SHARD_BUDGET - 1e-9))


def summary(load: Load, costs: dict[str, dict[str, float]]) -> dict[str, float]:
    cores = load.price(costs, "cpu_us") / 1e6
    return {
        "commands_per_s": load.price(costs, "commands"),
        "client_commands_per_s": load.price(costs, "client_commands"),
        "redis_cores": cores,
        "shards": shards(cores),
        "bytes_per_s": load.price(costs, "bytes_in") + load.price(costs, "bytes_out"),
        "offered_per_s": load.offered,
        "over_admitted_per_s": load.over_admitted,
        "refused_under_per_s": load.refused_under,
        **{f"{kind}_per_s": n for kind, n in load.units.items()},
    }

"""Per-request latencies from the load generators' logs, and their percentiles (in ms)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class H2loadLog:
    """h2load --log-file: start µs since epoch, HTTP status, µs until the end of the response."""

    latencies_ms: list[float]
    non_2xx: int


def read_h2load_log(path: Path) -> H2loadLog:
    latencies: list[float] = []
    bad = 0
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) < 3:
            continue
        if not fields[1].startswith("2"):
            bad += 1
            continue
        latencies.append(int(fields[2]) / 1000.0)
    return H2loadLog(latencies, bad)


def read_float64_file(path: Path) -> list[float]:
    """The Node client's latency file: little-endian float64 milliseconds."""
    values = array("d")
    values.frombytes(path.read_bytes())
    return values.tolist()


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of already sorted values; NaN when there are none."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass(frozen=True, slots=True)
class LatencySummary:
    count: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float


def summarize(latencies: Iterable[float]) -> LatencySummary:
    ordered = sorted(latencies)
    top = ordered[-1] if ordered else math.nan
    return LatencySummary(
        len(ordered),
        percentile(ordered, 50),
        percentile(ordered, 90),
        percentile(ordered, 99),
        top,
    )

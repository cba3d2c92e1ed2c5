"""What a real sidecar's answers are measured against: the exact references of
simulator/exact/ replayed on recorded send times, and trailing-window counts."""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from harness.load import Answer, drive
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.core.types import KeyId
from ratelimit_sidecar.storage.keys import DEFAULT_PREFIX, KeySchema, bucket_suffix, span_suffix
from simulator.exact.fixed_window import ExactFixedWindow
from simulator.exact.sliding_log import ExactSlidingLog
from simulator.exact.sliding_window import ExactSlidingWindow
from simulator.exact.token_bucket import Bucket

EVENTUAL = ("fixed_window", "sliding_window", "token_bucket")
ALL = (*EVENTUAL, "sliding_log")
Decide = Callable[[int, int], bool]  # (now ms, hits) -> admitted
DAY_MS = 86_400_000
# Limits never reached, for checking what the store holds: hour windows of 4 spans, and a
# bucket of a million tokens refilled by one a day, so that its debt in days is its hits.
FLUSH_LIMITS = {
    "fixed_window": "unit: hour, requests_per_unit: 1000000, spans: 4",
    "sliding_window": "unit: hour, requests_per_unit: 1000000, spans: 4",
    "token_bucket": "unit: day, requests_per_unit: 1, burst: 1000000",
}


def exact_reference(
    algorithm: str, max_hits: int, window_ms: int, spans: int, cooldown_ms: int | None = 0
) -> Decide:
    """The exact rule of `algorithm` (burst = max_hits; a fixed window's `cooldown_ms` None is
    `cooldown: window_end`, 0 its default of one window)."""
    if algorithm == "fixed_window":
        cooldown = window_ms if cooldown_ms == 0 else cooldown_ms
        return ExactFixedWindow(max_hits, window_ms, cooldown).hit
    if algorithm == "sliding_window":
        return ExactSlidingWindow(max_hits, window_ms, spans).hit
    if algorithm == "sliding_log":
        return ExactSlidingLog(max_hits, window_ms).hit
    bucket = Bucket(max_hits, Fraction(max_hits, window_ms), Fraction(max_hits))
    return lambda now, hits: bucket.take(now, hits).admitted


def ms(seconds: float) -> int:
    return int(seconds * 1000)


def admitted_times(answers: Sequence[Answer]) -> list[int]:
    return [ms(a.at) for a in answers if a.code == wire.Code.OK]


def exact_admitted_times(decide: Decide, answers: Sequence[Answer]) -> list[int]:
    """The exact rule fed the same arrivals (every request sent, of every node, one hit each)."""
    return [ms(a.at) for a in answers if decide(ms(a.at), 1)]


def worst_trailing(times_ms: Sequence[int], window_ms: int) -> int:
    """The most admitted hits in any trailing window (t - W, t]; `times_ms` sorted."""
    return max(
        (i + 1 - bisect_right(times_ms, t - window_ms) for i, t in enumerate(times_ms)), default=0
    )


def drive_keys(
    addresses: list[str],
    rates: list[float],
    seconds: float,
    values: dict[str, str],
    *,
    jitter: float = 0.0,
) -> dict[str, list[Answer]]:
    """`drive` for every (descriptor key, value) of `values` at once, each on its own threads:
    one descriptor per request, so no rule's refusal holds back another's count."""
    out: dict[str, list[Answer]] = {}

    def run(key: str) -> None:
        out[key] = drive(addresses, rates, seconds, [(key, values[key])], jitter=jitter)

    threads = [threading.Thread(target=run, args=(key,)) for key in values]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 60)
    return out


def stored_hits(client: Any, algorithm: str, key: KeyId, prefix: str = DEFAULT_PREFIX) -> int:
    """The hits the store holds for `key` under its FLUSH_LIMITS rule: the fixed window's
    counters, the sliding window's span counters (of the last hour), the bucket's debt in
    emission intervals. `client`: a redis-py client of a server or of a cluster."""
    schema, now_ms = KeySchema(prefix), time.time_ns() // 1_000_000
    if algorithm == "token_bucket":
        tat = float(client.get(f"{schema.tag(key)}{bucket_suffix(key)}") or 0)
        debt_days = (tat - now_ms) / DAY_MS
        assert abs(debt_days - round(debt_days)) < 0.01, debt_days  # seconds of refill at most
        return round(debt_days)
    if algorithm == "fixed_window":
        hour = now_ms // 3_600_000
        names = [schema.counter(key, w) for w in (hour - 1, hour)]
    else:
        span = now_ms // 900_000  # an hour in 4 spans
        names = [f"{schema.tag(key)}{span_suffix(key, s)}" for s in range(span - 4, span + 1)]
    return sum(int(client.get(name) or 0) for name in names)

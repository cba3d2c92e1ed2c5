"""What the decision metrics cost per request, timed in-process with `timeit`.

Per request the servicer times the decision (two `perf_counter()` calls) and feeds
`Metrics.decision_seconds.observe`; for the usual request (one counted descriptor, admitted)
the handler calls `Metrics.admitted` with the counters it looked up once for that request
(`Metrics.tally`) and the verdict. Each is timed against a plain
no-op call, and `RateLimitHandler.decide` is timed
with and without the Metrics observer (one descriptor, the bench rule, as in the load runs).
"""

from __future__ import annotations

import tempfile
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.frames import DOMAIN, KEY, RULES_YAML, request
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.config.matcher import match
from ratelimit_sidecar.core import Hit, Limiter
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.service.ratelimit import RateLimitHandler

NOOP = "no-op call f(x) (baseline)"
PERF_COUNTER = "time.perf_counter()"
SERVICER = "perf_counter x2 + observe (servicer)"
DECIDED = "Metrics.admitted(1 descriptor)"
PLAIN = "handler.decide, no observer"
OBSERVED = "handler.decide, Metrics observer"
NUMBER = 20_000
DECIDE_NUMBER = 4_000
REPEAT = 5
SAMPLE_SECONDS = 0.00004  # a typical decision time: lands in a middle bucket


@dataclass(frozen=True, slots=True)
class Cost:
    name: str
    us_per_call: float


def per_call_us(fn: Callable[[], object], number: int = NUMBER) -> float:
    """Best of REPEAT timings (the least disturbed), in µs per call."""
    return min(timeit.repeat(fn, number=number, repeat=REPEAT)) / number * 1e6


def _noop(_seconds: float) -> None:
    return None


def _clock_ms() -> int:
    return int(time.time() * 1000)


def _rules_dir(tmp: Path) -> Path:
    (tmp / "bench.yaml").write_text(RULES_YAML)
    return tmp


def measure() -> list[Cost]:
    with tempfile.TemporaryDirectory(prefix="rls-bench-hotpath-") as tmp:
        rules = load_rules(_rules_dir(Path(tmp)))
    metrics = Metrics()
    observe = metrics.decision_seconds.observe
    domain = rules.domain(DOMAIN)
    assert domain is not None
    hits = [Hit(match(domain, [(KEY, "c0")]), (DOMAIN, KEY, "c0"), 1)]
    verdict = Limiter().hit(_clock_ms(), hits).verdicts[0]
    tally = metrics.tally(DOMAIN, hits)  # once per distinct request, kept with it
    message = request("c0").SerializeToString()  # decide() takes the request's wire bytes
    plain = RateLimitHandler(rules, Limiter(), _clock_ms)
    observed = RateLimitHandler(rules, Limiter(), _clock_ms, observer=metrics)

    def servicer_timing() -> None:  # what RateLimitServicer does around decide()
        started = time.perf_counter()
        observe(time.perf_counter() - started)

    return [
        Cost(NOOP, per_call_us(lambda: _noop(SAMPLE_SECONDS))),
        Cost(PERF_COUNTER, per_call_us(lambda: time.perf_counter())),  # noqa: PLW0108 - wrapped like the rest
        Cost("decision_seconds.observe(x)", per_call_us(lambda: observe(SAMPLE_SECONDS))),
        Cost(SERVICER, per_call_us(servicer_timing)),
        Cost(DECIDED, per_call_us(lambda: metrics.admitted(tally, 0, verdict))),
        Cost(PLAIN, per_call_us(lambda: plain.decide(message), DECIDE_NUMBER)),
        Cost(OBSERVED, per_call_us(lambda: observed.decide(message), DECIDE_NUMBER)),
    ]


def added_per_request(costs: list[Cost]) -> dict[str, float]:
    """µs the metrics add to one request.

    The servicer reads perf_counter() once per request even without metrics, so the histogram
    adds one more read and observe(); the counters add one admitted() call. decide() with and
    without the observer is context.
    """
    us = {c.name: c.us_per_call for c in costs}
    latency = us[SERVICER] - us[PERF_COUNTER]
    counters = us[DECIDED]
    return {
        "latency_histogram_us": latency,
        "decision_counters_us": counters,
        "total_us": latency + counters,
        "decide_us": us[PLAIN],
        "decide_with_metrics_us": us[OBSERVED],
    }

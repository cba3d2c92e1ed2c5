"""What one decision costs in-process, and what the metrics add to it.

`RateLimitHandler.respond` (request bytes in, response bytes out) is timed by how often the
sidecar has seen the request before: repeated (hot keys), seen before (100,000 clients that keep
coming back), and never seen (parse, validate, match, a new counter, a cache entry: a flood of
fresh values), also with a key table too small for the flood, where each new counter evicts an
idle one. A loop keeps the CPU caches warmer than a busy server does: these are lower bounds.

The metrics on the request path are timed with `timeit` against a plain no-op call: the
servicer's decision timing (two `perf_counter()` calls and a histogram `observe`) and the
decision counters (`Metrics.admitted`, one descriptor), and `decide` with and without them.
"""

from __future__ import annotations

import gc
import time
import timeit
from collections.abc import Callable, Sequence
from functools import partial

from bench.report import Options, Outcome, table, write_results
from bench.workload import DOMAIN, KEY, bench_rules, handler, key_values, limiter, request
from harness.answer import answer_now
from ratelimit_sidecar.config.matcher import match
from ratelimit_sidecar.core import Hit
from ratelimit_sidecar.metrics import Metrics

NAME = "decision"
DISTINCT = 100_000
HOT_KEYS = 10
HOT_CALLS = 100_000
CLOCK_STEP_MS = 0.1  # a decision every 0.1 ms of the fake clock: 10,000 requests per second
NUMBER, DECIDE_NUMBER, REPEAT = 20_000, 4_000, 5
SAMPLE_SECONDS = 0.00004  # a typical decision time: lands in a middle histogram bucket
NOOP, PERF_COUNTER, SERVICER, COUNTERS = (
    "no-op call",
    "perf_counter()",
    "servicer timing",
    "admitted",
)

Costs = dict[str, float]  # what was timed -> µs per call


class FakeClock:
    """Advances by CLOCK_STEP_MS per read: windows and spans roll as at 10,000 RPS."""

    def __init__(self) -> None:
        self.now = time.time() * 1000

    def __call__(self) -> int:
        self.now += CLOCK_STEP_MS
        return int(self.now)


def loop_us(decide: Callable[[bytes], bytes], bodies: Sequence[bytes]) -> float:
    started = time.perf_counter()
    for body in bodies:
        decide(body)
    return (time.perf_counter() - started) / len(bodies) * 1e6


def decide_costs() -> Costs:
    """µs per `decide` with metrics, by how often the request was seen before."""
    distinct = [request(v).SerializeToString() for v in key_values(DISTINCT)]
    hot = distinct[:HOT_KEYS] * (HOT_CALLS // HOT_KEYS)
    small_table = DISTINCT // 2  # the second half of the new keys each evict an idle one
    big = handler(2 * DISTINCT, FakeClock(), metrics=Metrics())
    small = handler(small_table, FakeClock(), metrics=Metrics(), cache_entries=2 * DISTINCT)
    gc.collect()
    gc.freeze()  # as the server does after startup
    try:
        return {
            f"first sight ({DISTINCT:,} new requests)": loop_us(partial(answer_now, big), distinct),
            f"seen before ({DISTINCT:,} requests, each again)": loop_us(
                partial(answer_now, big), distinct
            ),
            f"repeated ({HOT_KEYS} requests, {HOT_CALLS:,} calls)": loop_us(
                partial(answer_now, big), hot
            ),
            f"first sight, half evicting (--max-keys {small_table:,})": loop_us(
                partial(answer_now, small), distinct
            ),
        }
    finally:
        gc.unfreeze()


def per_call_us(fn: Callable[[], object], number: int = NUMBER) -> float:
    """Best of REPEAT timings (the least disturbed), in µs per call."""
    return min(timeit.repeat(fn, number=number, repeat=REPEAT)) / number * 1e6


def metrics_costs() -> Costs:
    """µs per call of each metrics step on the request path, and of `decide` without and with
    the metrics (one descriptor, the bench rule)."""
    rules, metrics = bench_rules(), Metrics()
    observe = metrics.decision_seconds.observe
    domain = rules.domain(DOMAIN)
    assert domain is not None
    hits = [Hit(match(domain, [(KEY, "c0")]), (DOMAIN, KEY, "c0"), 1)]
    verdict = limiter(max_keys=HOT_KEYS).hit(int(time.time() * 1000), hits).verdicts[0]
    tally = metrics.tally(DOMAIN, hits)  # once per distinct request, kept with it
    body = request("c0").SerializeToString()
    plain = handler(HOT_KEYS, FakeClock(), rules=rules)
    observed = handler(HOT_KEYS, FakeClock(), rules=rules, metrics=metrics)

    def servicer_timing() -> None:  # what the servicer does around decide()
        started = time.perf_counter()
        observe(time.perf_counter() - started)

    return {
        NOOP: per_call_us(lambda: _noop(SAMPLE_SECONDS)),
        PERF_COUNTER: per_call_us(time.perf_counter),
        "decision_seconds.observe(x)": per_call_us(lambda: observe(SAMPLE_SECONDS)),
        SERVICER: per_call_us(servicer_timing),
        COUNTERS: per_call_us(lambda: metrics.admitted(tally, 0, verdict)),
        "decide, no metrics": per_call_us(lambda: answer_now(plain, body), DECIDE_NUMBER),
        "decide, with metrics": per_call_us(lambda: answer_now(observed, body), DECIDE_NUMBER),
    }


def _noop(_seconds: float) -> None:
    return None


def metrics_added_us(costs: Costs) -> float:
    """µs the metrics add to a request: the servicer reads perf_counter() once per request even
    without metrics, so the histogram adds one more read and observe(); the counters one call."""
    return costs[SERVICER] - costs[PERF_COUNTER] + costs[COUNTERS]


def render(decide: Costs, metrics: Costs) -> str:
    noop = metrics[NOOP]
    rows = [["decide with metrics", case, "", f"{us:.2f}", ""] for case, us in decide.items()]
    rows += [
        ["metrics", name, "", f"{us:.3f}", f"{us - noop:+.3f}"] for name, us in metrics.items()
    ]
    text = table(("timed", "call", "", "µs/call", "vs no-op µs"), rows)
    return (
        f"{text}\nmetrics add {metrics_added_us(metrics):.2f} µs per request (histogram + counters)"
    )


def run(options: Options) -> Outcome:
    print(f"[{NAME}] in-process RateLimitHandler.respond and metrics costs")
    decide, metrics = decide_costs(), metrics_costs()
    print(f"\n{render(decide, metrics)}")
    document = {"decide_us": decide, "metrics_us": metrics}
    document["metrics_added_us"] = {"total": metrics_added_us(metrics)}
    return Outcome(None, write_results(options, NAME, document))

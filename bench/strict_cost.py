"""Where a strict request's server CPU goes, in-process, against the `limits` baseline's call.

This process runs on the server core and Redis on the other one, as in `bench strict`. On one
uvloop event loop, CONCURRENCY tasks (the load's 10 connections x 8 streams) each await the same
call in turn; a row is the process CPU time per call (µs), so Redis's own work is not in it.
The rows take a strict request apart, from the whole handler down to one redis-py command:

* handler: `RateLimitHandler.respond` of a hot-10 request to a strict rule, metrics on (what
  the servicer awaits), once per algorithm;
* decider: `StrictDecider.decide` of the matched hits (fixed window);
* decider, no Redis: the same with a store that answers at once: the decider's own Python;
* store: `StrictStore.check` of one fixed-window check (packing, EVALSHA, parsing);
* limits servicer: the baseline's whole ShouldRateLimit on a parsed request (its Redis call,
  the key, the response built); grpc's parsing of the request is not in it;
* limits incr: the baseline's call alone, `limits` async Redis storage `incr` (its INCRBY+EXPIRE
  script);
* redis-py INCR: one plain command, the least a call to Redis costs on this client.

Then cProfile of the fixed-window handler row: the functions with the most own time.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import os
import pstats
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import uvloop
from limits import RateLimitItemPerSecond
from limits.aio.storage import RedisStorage as LimitsStorage

from bench.load.cpu import choose_pinning
from bench.per_request_redis import pin
from bench.report import Options, Outcome, table, write_results
from bench.services import Limits
from bench.strict import strict_rule
from bench.workload import DOMAIN, key_values, request, rules_dir
from harness.redis_servers import ServerGroup
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.config.model import AlgorithmName
from ratelimit_sidecar.core import FleetLimiter
from ratelimit_sidecar.core.types import Hit
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.service.ratelimit import RateLimitHandler
from ratelimit_sidecar.service.strict import StrictDecider
from ratelimit_sidecar.storage.redis_urls import open_redis
from ratelimit_sidecar.storage.strict_store import StrictAnswer, StrictCheck, StrictStore

NAME = "strict-cost"
CONCURRENCY = 80
CALLS = 8_000  # per row
PROFILE_CALLS = 4_000
TOP_FUNCTIONS = 18
BASELINE = "limits servicer (the baseline)"
Call = Callable[[int], Awaitable[object]]  # the i-th call


async def cpu_us_per_call(call: Call, calls: int = CALLS) -> float:
    """Process CPU µs per call, CONCURRENCY tasks awaiting `call` in turn (after a warm-up)."""

    async def worker(first: int, count: int) -> None:
        for i in range(first, first + count):
            await call(i)

    async def all_of(count: int) -> None:
        share = count // CONCURRENCY
        await asyncio.gather(*(worker(w * share, share) for w in range(CONCURRENCY)))

    await all_of(CONCURRENCY * 10)
    started = time.process_time()
    await all_of(calls)
    return (time.process_time() - started) / calls * 1e6


class Answering:
    """A strict store that admits every check at once, without Redis."""

    async def check(self, checks: Sequence[StrictCheck]) -> list[StrictAnswer]:
        return [StrictAnswer(True, 1_000, 500, True, 0) for _ in checks]


def clock_ms() -> int:
    return int(time.time() * 1000)


def strict_handler(workdir: Path, redis_url: str, algorithm: AlgorithmName) -> RateLimitHandler:
    """The server's handler for one strict rule of `algorithm`, as `serve --redis-url` builds it."""
    home = workdir / algorithm.text
    home.mkdir(exist_ok=True)
    rules = load_rules(rules_dir(home, strict_rule(algorithm)))
    limiter = FleetLimiter(10_000)
    decider = StrictDecider(limiter, StrictStore(open_redis(redis_url)), timeout_ms=50)
    return RateLimitHandler(rules, limiter, clock_ms, observer=Metrics(), strict=decider)


def hits_of(handler: RateLimitHandler, body: bytes) -> tuple[Hit, ...]:
    """The matched hits of `body`, as the handler compiled them."""
    compiled = handler._compiled.get(body)
    assert compiled is not None, "respond() to the body first"
    return compiled.hits


async def measure(workdir: Path, redis_url: str) -> tuple[dict[str, float], str]:
    """µs of process CPU per call by row, and the profile of the fixed-window handler."""
    bodies = [request(v).SerializeToString() for v in key_values(10)]
    costs: dict[str, float] = {}
    handlers = {a: strict_handler(workdir, redis_url, a) for a in AlgorithmName}
    for algorithm, handler in handlers.items():
        costs[f"handler, {algorithm.text}"] = await cpu_us_per_call(
            lambda i, h=handler: h.respond(bodies[i % 10])  # type: ignore[misc]
        )
    fixed = handlers[AlgorithmName.FIXED_WINDOW]
    decider = fixed._strict
    assert decider is not None
    hits = [hits_of(fixed, b) for b in bodies]
    costs["decider, fixed_window"] = await cpu_us_per_call(
        lambda i: decider.decide(clock_ms(), hits[i % 10])
    )
    offline = StrictDecider(decider.limiter, Answering(), timeout_ms=50)
    costs["decider, no Redis"] = await cpu_us_per_call(
        lambda i: offline.decide(clock_ms(), hits[i % 10])
    )
    checks = [decider.split(h).checks for h in hits]
    store = decider.store
    costs["store check, fixed_window"] = await cpu_us_per_call(
        lambda i: store.check(checks[i % 10])
    )
    costs.update(await baseline_costs(redis_url))
    return costs, await profile(lambda i: fixed.respond(bodies[i % 10]))


async def baseline_costs(redis_url: str) -> dict[str, float]:
    limits = LimitsStorage(f"async+{redis_url}", wrap_exceptions=True, implementation="redispy")
    item = RateLimitItemPerSecond(1_000_000_000)
    keys = [item.key_for(DOMAIN, f"client=c{i}") for i in range(10)]
    servicer = Limits(redis_url)
    parsed = [request(f"c{i}") for i in range(10)]
    costs = {
        BASELINE: await cpu_us_per_call(lambda i: servicer.ShouldRateLimit(parsed[i % 10], None)),
        "limits incr (the baseline's call)": await cpu_us_per_call(
            lambda i: limits.incr(keys[i % 10], item.get_expiry())
        ),
    }
    client = open_redis(redis_url).client
    costs["redis-py INCR"] = await cpu_us_per_call(lambda i: client.incr(f"bench:{i % 10}"))
    return costs


async def profile(call: Call) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    await cpu_us_per_call(call, PROFILE_CALLS)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(TOP_FUNCTIONS)
    return out.getvalue()


def run(options: Options) -> Outcome:
    print(f"[{NAME}] in-process CPU per strict request, by layer, against the `limits` call")
    pinning = choose_pinning()
    os.sched_setaffinity(0, pinning.server_cpus)
    with tempfile.TemporaryDirectory(prefix="rls-bench-") as tmp:
        group = ServerGroup(Path(tmp) / "redis")
        try:
            redis = group.standalone()
            pin(redis, pinning)
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                costs, profiled = runner.run(measure(Path(tmp), redis.url))
        finally:
            group.stop_all()
    base = costs[BASELINE]
    rows = [[name, f"{us:.1f}", f"{us - base:+.1f}"] for name, us in costs.items()]
    text = table(("call", "CPU µs/call", "vs limits servicer µs"), rows, left=1)
    print(f"\n{CONCURRENCY} concurrent tasks, {CALLS:,} calls per row\n{text}")
    print(f"\ncProfile, fixed-window handler, {PROFILE_CALLS:,} calls:\n{profiled}")
    document = {"cpu_us_per_call": costs, "profile": profiled, "pinning": pinning.describe()}
    return Outcome(None, write_results(options, NAME, document))

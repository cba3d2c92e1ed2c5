"""What `--workers 2` gives over `--workers 1` on this machine, and what the metrics cost. The real
CLI (local-only) under h2load's hot-10 over 20 connections: SO_REUSEPORT spreads connections,
not requests, so each worker's /metrics tells its share. Unpinned: 2 workers need both cores,
so the load generator shares them. The metrics' cost is timed in-process against 1 worker's CPU
time per request. No target.
"""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable
from functools import partial

from bench import compare
from bench.load import runs
from bench.load.clients import H2load, LoadShape
from bench.load.runs import Bench, Run
from bench.load.servers import READY_TIMEOUT_S, ServerProcess, local_address, sidecar_args
from bench.report import Options, Outcome, conclude
from bench.workload import DOMAIN, KEY, bench_rules, hot_10, rules_dir
from harness.net import consecutive_free_ports, http_ok
from harness.process import NotReady, wait_ready
from ratelimit_sidecar.config.matcher import match
from ratelimit_sidecar.core import Hit, LocalLimiter
from ratelimit_sidecar.grpc_server.rls import TIMED_EVERY
from ratelimit_sidecar.metrics import Metrics

WORKER_COUNTS = (1, 2)
SHAPE = LoadShape(connections=20, streams=4, settle_s=0.5, duration_s=2.0)
ROUNDS = 4
WARM_UP_S = 1.5
MAX_KEYS = 200_000
NUMBER, REPEAT = 20_000, 5  # timeit: calls per timing, timings (the least disturbed wins)
RETRY_BUDGET_S = 30.0
DECISIONS_METRIC = "ratelimit_sidecar_total_hits"


class Fleet(ServerProcess):
    """The sidecar with `--workers N`: a supervisor and N workers sharing the gRPC port (with
    N = 1 the process itself serves); worker i serves /metrics and /readyz on port + i."""

    def __init__(self, workers: int, bench: Bench) -> None:
        self.workers, self.metrics_port = workers, consecutive_free_ports(workers)
        address, rules = local_address(), rules_dir(bench.workdir)
        args = sidecar_args(address, rules, "--workers", str(workers), "--max-keys", str(MAX_KEYS))
        args[args.index("--metrics-address") + 1] = f"127.0.0.1:{self.metrics_port}"
        name = f"{workers} worker" + "s" * (workers > 1)
        super().__init__(name, args, address, bench)

    def url(self, index: int, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.metrics_port + index}{path}"

    def wait_ready(self) -> None:
        """The shared gRPC port answers, every worker's /readyz says ready, N workers run."""
        super().wait_ready()
        try:
            for index in range(self.workers):
                ready = partial(http_ok, self.url(index, "/readyz"))
                wait_ready(ready, self.proc, READY_TIMEOUT_S, interval_s=0.1)
            if self.workers > 1 and len(self.pids) != self.workers + 1:
                raise NotReady(f"expected {self.workers} workers, found {self.pids}")
        except NotReady as error:
            self.stop()
            raise RuntimeError(f"{self.name}: {error}:\n{self.log.read_text()[-2000:]}") from None

    def counters(self) -> dict[str, int]:
        """Decisions counted by each worker so far (from its own /metrics)."""
        found = [self.metrics(DECISIONS_METRIC, self.url(i)) for i in range(self.workers)]
        return {f"worker {i + 1}": int(sum(one.values())) for i, one in enumerate(found)}


def split(row: Run) -> str:
    total = sum(row.counters.values())
    return "/".join(f"{n / total:.0%}" for n in row.counters.values()) if total else "-"


def metrics_added_us() -> float:
    """µs the metrics add to a request (one descriptor), best of REPEAT timings: the histogram's
    two clock reads and observe() for one call in TIMED_EVERY, and the counters' every call."""
    rules, metrics = bench_rules(), Metrics()
    observe = metrics.decision_seconds.observe
    domain = rules.domain(DOMAIN)
    assert domain is not None
    hits = [Hit(match(domain, [(KEY, "c0")]), (DOMAIN, KEY, "c0"), 1)]
    verdict = LocalLimiter(max_keys=10).hit(int(time.time() * 1000), hits).verdicts[0]
    tally = metrics.tally(DOMAIN, hits)  # once per distinct request, kept with it

    def servicer_timing() -> None:  # what the servicer does around respond()
        started = time.perf_counter()
        observe(time.perf_counter() - started)

    def per_call_us(fn: Callable[[], object]) -> float:
        return min(timeit.repeat(fn, number=NUMBER, repeat=REPEAT)) / NUMBER * 1e6

    counters = per_call_us(lambda: metrics.admitted(tally, 0, verdict))
    return per_call_us(servicer_timing) / TIMED_EVERY + counters


def summary(measured: list[Run], added: float) -> list[str]:
    gains = runs.median(runs.ratios(measured, "2 workers", "1 worker", H2load.name))
    gain = f"workers: 2 workers give {gains:.2f}x the RPS of 1 (median of rounds)"
    lines = [gain] if gains else []
    text = f"metrics add {added:.2f} µs per request (histogram + counters, timed in-process)"
    one = next((row for row in runs.rows(measured) if row.server == "1 worker"), None)
    if one is not None and (per_request := one.cpu_us()):
        text += f": {added / per_request:.1%} of 1 worker's {per_request:.0f} µs CPU per request"
    return [*lines, text]


LEGEND = """\
Unpinned: CPU % of one core (the machine has 100 % per CPU); other CPU % = other work anywhere
on the machine; split = decisions per worker (each worker's /metrics)."""


def run(options: Options) -> Outcome:
    added, measured = metrics_added_us(), list[Run]()
    with runs.session(options, RETRY_BUDGET_S, ROUNDS, SHAPE, pin=False) as bench:
        if clients := runs.usable(bench, [H2load()]):
            work, starters = hot_10(), [partial(Fleet, count, bench) for count in WORKER_COUNTS]
            measured = runs.side_by_side(bench, starters, clients, work, warm=WARM_UP_S)
    lines, document = compare.report(bench, measured, columns=[("split", split)], legend=LEGEND)
    lines += summary(measured, added)
    document["metrics_added_us"] = added
    return conclude(options, lines, document)

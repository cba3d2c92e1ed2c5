"""Sliding windows and token buckets at the edge on real processes: three sidecars share one
Redis; a client sends ShouldRateLimit round robin over them at a set rate (bench/edge.py's).

- hot: one key per algorithm (240 per 10 s, 6 spans; the bucket's burst is MAX) offered at 2x
  and 10x over WINDOWS windows, with `--default-consistency eventual` and the default (edge).
  The worst trailing window the fleet admitted (any 10 s, from the client's clock) against
  the algorithm's exact reference fed the same arrivals (simulator/references.py), and the
  store work for the key: keys the syncs carried per request. Targets: worst <= reference +
  2 % of MAX at 2x and + 5 % at 10x; store work <= 0.2 and <= 0.1 per request.
- tiny: a new key of 3 a minute per algorithm; one request on each gateway at once, then one
  more on each 30 ms later. Target: 3 admitted.
- fresh: FRESH new values of each algorithm, each seen once: store work per request over a
  window and a span after them. Target: <= 0.05 per request.
- decision cost away from the edge, per algorithm: `FleetLimiter.hit` in-process, eventual and
  edge rules in alternating rounds (bench/edge.py's). Target: edge within 5 % of eventual.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.edge import (
    FRESH,
    FRESH_TARGET,
    LATENCY_RATIO,
    NODES,
    Fleet,
    decision_cost,
    fleet,
    next_window_start,
    paced,
    tiny_limit,
)
from bench.report import Options, Outcome, conclude, passing, table
from harness.redis_servers import ServerProcess, server_group
from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Unit
from simulator.metrics import worst_trailing
from simulator.references import reference_for

LIMIT, WINDOW_S, WINDOWS, SPANS = 240, 10, 4, 6
MARGINS = {2: 0.02, 10: 0.05}  # load -> worst trailing window over the reference, of MAX
STORE_TARGETS = {2: 0.2, 10: 0.1}
ALGORITHMS = (AlgorithmName.SLIDING_WINDOW, AlgorithmName.TOKEN_BUCKET)
MODES = {"eventual": ("--default-consistency", "eventual"), "edge": ()}
DOMAIN = "edge"  # bench/edge.py's fleet writes its rules under this domain
RULES = "domain: edge\ndescriptors:\n" + "".join(
    f"""  - key: {a.text}
    rate_limit: {{unit: second, unit_multiplier: {WINDOW_S}, requests_per_unit: {LIMIT},
                  algorithm: {a.text}, spans: {SPANS}}}
  - key: {a.text}-tiny
    rate_limit: {{unit: minute, requests_per_unit: 3, algorithm: {a.text}}}
"""
    for a in ALGORITHMS
)


@dataclass(frozen=True, slots=True)
class TrailingRun:
    algorithm: str
    mode: str
    load: int
    worst: int
    reference: int
    store_per_request: float

    def met(self) -> bool:
        held = self.worst <= self.reference + MARGINS[self.load] * LIMIT
        return held and self.store_per_request <= STORE_TARGETS[self.load]


def reference_worst(algorithm: AlgorithmName, arrivals: list[tuple[int, bool]]) -> int:
    """The exact rule's worst trailing window on the same arrivals, one hit each."""
    limit = RateLimit(LIMIT, Unit.SECOND, WINDOW_S, algorithm=algorithm, spans=SPANS)
    reference = reference_for(limit)
    return worst_trailing([t for t, _ in arrivals if reference.hit(t)], limit.window_ms)


def hot_run(clients: Fleet, algorithm: AlgorithmName, mode: str, load: int) -> TrailingRun:
    start = next_window_start(0.2)
    time.sleep(max(0.0, start - time.time()))
    before = clients.store_work()
    rate, until = load * LIMIT / WINDOW_S, start + WINDOWS * WINDOW_S
    sent = paced(clients, algorithm.text, "v", rate, until)
    time.sleep(0.5)  # the last pushes
    work = (clients.store_work() - before) / max(1, sent.requests)
    worst = worst_trailing([t for t, ok in sent.arrivals if ok], 1000 * WINDOW_S)
    reference = reference_worst(algorithm, sent.arrivals)
    return TrailingRun(algorithm.text, mode, load, worst, reference, work)


def fresh_keys(clients: Fleet, algorithm: AlgorithmName, count: int = FRESH) -> float:
    before = clients.store_work()
    for n in range(count):
        clients.ask(n % NODES, algorithm.text, f"f{n}")
    time.sleep(WINDOW_S + WINDOW_S / SPANS + 1.0)  # until their hits count no more
    return (clients.store_work() - before) / count


def run(options: Options) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="rls-bench-edge-trailing-") as tmp:
        workdir = Path(tmp)
        with server_group(workdir / "redis") as group:
            return report(options, measure(workdir, group.standalone()))


def measure(workdir: Path, store: ServerProcess) -> dict[str, object]:
    runs = []
    for algorithm in ALGORITHMS:
        for load in MARGINS:
            for mode, flags in MODES.items():
                with fleet(workdir, store, *flags, rules_text=RULES) as clients:
                    runs.append(hot_run(clients, algorithm, mode, load))
    with fleet(workdir, store, rules_text=RULES) as clients:
        tiny = {a.text: tiny_limit(clients, f"{a.text}-tiny") for a in ALGORITHMS}
        fresh = {a.text: fresh_keys(clients, a) for a in ALGORITHMS}
    cost = {a.text: decision_cost(algorithm=a) for a in ALGORITHMS}
    return {"runs": runs, "tiny": tiny, "fresh": fresh, "decision_ns": cost}


def report(options: Options, found: dict[str, object]) -> Outcome:
    runs, tiny, fresh, cost = found["runs"], found["tiny"], found["fresh"], found["decision_ns"]
    assert isinstance(runs, list) and isinstance(tiny, dict) and isinstance(fresh, dict)
    assert isinstance(cost, dict)
    # The least disturbed rounds of each mode.
    ratios = {a: min(c["edge"]) / min(c["eventual (before)"]) for a, c in cost.items()}
    rows = [
        [r.algorithm, r.mode, f"{r.load}x", str(r.worst), str(r.reference),
         f"{100 * (r.worst - r.reference) / LIMIT:+.1f} %", f"{r.store_per_request:.3f}",
         passing(r.met()) if r.mode == "edge" else "-"]
        for r in runs
    ]  # fmt: skip
    header = ["algorithm", "mode", "load", "worst 10 s", "exact", "over, of MAX", "store/req"]
    verdicts = [
        *(r.met() for r in runs if r.mode == "edge"),
        *(n == 3 for n in tiny.values()),
        *(work <= FRESH_TARGET for work in fresh.values()),
        *(ratio <= LATENCY_RATIO for ratio in ratios.values()),
    ]
    lines = [
        f"one key, {LIMIT} per {WINDOW_S} s on {NODES} sidecars, {WINDOWS} windows",
        table([*header, "target"], rows, left=3),
        f"a new key of 3 a minute, 3 gateways at once then again 30 ms later: {tiny} admitted,"
        f" target 3: {passing(all(n == 3 for n in tiny.values()))}",
        *(
            f"{FRESH:,} fresh {a} keys: {work:.4f} store work per request, target <="
            f" {FRESH_TARGET}: {passing(work <= FRESH_TARGET)}"
            for a, work in fresh.items()
        ),
        *(
            f"a {a} decision away from the edge in-process (ns, per round): "
            f"{', '.join(f'{m} {[round(n) for n in v]}' for m, v in cost[a].items())}; edge /"
            f" before (fastest rounds) {ratio:.3f}, target <= {LATENCY_RATIO}:"
            f" {passing(ratio <= LATENCY_RATIO)}"
            for a, ratio in ratios.items()
        ),
    ]
    document = {
        "runs": [asdict(r) for r in runs], "tiny": tiny, "fresh": fresh, "decision_ns": cost
    }  # fmt: skip
    return conclude(options, lines, document, verdicts)

"""`python -m simulator.cost`: a budget counted in cost, not requests (an AI gateway's tokens
per day), on the real core and sync schedule (simulator/engine.py).

Each request costs `hits_addend` drawn from [LOW, HIGH]. Part of the requests know their cost
up front: the check carries it and a refusal spends nothing. The others learn it from the
response (Envoy's `apply_on_stream_done`): the request is checked with 0 hits (admitted while
the budget is not spent), and its cost is reported RESPONSE_MS later in a call whose answer
nobody reads; it is spent whatever the answer, and the rule says `count_refused: true`. The
exact reference (one central counter) decides the same arrivals: a known cost fits in what is
left, a check finds budget left, and every report is counted. Measured: the worst window's
spend (true windows, the store's clock), the system's and the reference's, as a share of MAX.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from random import Random

from ratelimit_sidecar.config.model import Rule
from ratelimit_sidecar.core import Code, Hit
from simulator.engine import KEY, Engine
from simulator.params import SimParams
from simulator.scenarios import Setup, resolve
from simulator.variants import system_for

LOW, HIGH = 100, 5_000  # hits_addend of one request
AFTER_SHARE = 0.5  # of the requests, those whose cost is reported after the response
RESPONSE_MS = 2_000  # from the check to the report
COST, EXACT_COST = 100, 101  # a report to a node, to the reference (after the engine's kinds)
SYSTEMS = ("redis-time", "edge")


@dataclass
class ExactBudget:
    """One central counter per true window, no cooldown (a budget refuses while spent)."""

    max: int
    window_ms: int
    window: int = -1
    count: int = 0

    def _roll(self, t: int) -> None:
        w = t // self.window_ms
        if w != self.window:
            self.window, self.count = w, 0

    def take(self, t: int, cost: int) -> bool:
        self._roll(t)
        admitted = self.count + cost <= self.max if cost else self.count < self.max
        self.count += cost if admitted else 0
        return admitted

    def report(self, t: int, cost: int) -> None:
        self._roll(t)
        self.count += cost


def as_budget(rule: Rule) -> Rule:
    """The rule as a budget's docs advise: refused reports count, a block ends with its window."""
    assert rule.limit is not None
    limit = replace(rule.limit, count_refused=True, cooldown_window_end=True, cooldown_ms=0)
    return replace(rule, limit=limit, limits=(limit,))


class CostEngine(Engine):
    """The engine with costly requests: spend per true window, this system and the exact."""

    def __init__(self, setup: Setup, system: str) -> None:
        super().__init__(setup, system_for(system))
        self.rule = as_budget(self.rule)
        p = setup.params
        self.draw = Random(p.seed + 2)  # the same costs for every system
        self.exact = ExactBudget(p.max, p.window_ms)
        self.spent = [0] * p.windows
        self.exact_spent = [0] * p.windows

    def _window(self, t: int) -> int:
        return min((t - self.setup.start_ms) // self.setup.params.window_ms, len(self.spent) - 1)

    def _request(self, t: int, index: int) -> None:
        cost, after = self.draw.randint(LOW, HIGH), self.draw.random() < AFTER_SHARE
        hits, w = 0 if after else cost, self._window(t)
        if self.exact.take(t, hits):
            if after:
                self._at(t + RESPONSE_MS, EXACT_COST, index, cost)
            else:
                self.exact_spent[w] += cost
        ok = self._decide(index, t, hits)
        if ok and after:
            self._at(t + RESPONSE_MS, COST, index, cost)
        elif ok:
            self.spent[w] += cost
        self.recorder.request(t, index, ok)

    def _decide(self, index: int, t: int, hits: int) -> bool:
        node = self.nodes[index]
        ok = node.limiter.hit(t + node.offset, [Hit(self.rule, KEY, hits)]).code is Code.OK
        self._early_push(node, t + node.offset)
        if not node.tracking:
            self._first_key(node)
        return ok

    def _dispatch(self, kind: int, index: int, payload: object) -> None:
        if kind not in {COST, EXACT_COST}:
            super()._dispatch(kind, index, payload)
            return
        assert isinstance(payload, int)
        w = self._window(self.now)
        if kind == EXACT_COST:
            self.exact.report(self.now, payload)
            self.exact_spent[w] += payload
            return
        if index in self.nodes:  # the answer is not read: the cost was spent
            self._decide(index, self.now, payload)
        self.spent[w] += payload


@dataclass(frozen=True)
class Row:
    nodes: int
    load: float
    system: str
    worst: int  # the worst window's spend, pooled over seeds
    exact: int  # ... the exact reference's on the same arrivals and costs
    max: int
    store_per_request: float


def measure(params: SimParams, system: str, seeds: int) -> Row:
    worst = exact = calls = offered = 0
    for seed in range(params.seed, params.seed + seeds):
        engine = CostEngine(resolve(replace(params, seed=seed)), system)
        recorder = engine.run()
        worst, exact = max(worst, *engine.spent), max(exact, *engine.exact_spent)
        calls, offered = calls + recorder.store_calls, offered + sum(recorder.offered)
    load = params.load or 0.0
    return Row(params.nodes, load, system, worst, exact, params.max, calls / max(1, offered))


def rate_for(params: SimParams, load: float) -> float:
    """Requests per second that offer `load` times the budget, at the mean cost."""
    return params.per_second(load) / ((LOW + HIGH) / 2)


def render(rows: Sequence[Row]) -> str:
    lines = [
        "| nodes | load | system | worst window spend / MAX | exact reference | over it (% of MAX) "
        "| store calls per request |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        over = 100 * (r.worst - r.exact) / r.max
        lines.append(
            f"| {r.nodes} | {r.load:g}x | {r.system} | {r.worst / r.max:.3f} "
            f"| {r.exact / r.max:.3f} | {over:+.1f} | {r.store_per_request:.3f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m simulator.cost", description=__doc__)
    ap.add_argument("--nodes", default="4,8", help="comma list (default %(default)s)")
    ap.add_argument("--loads", default="2,10", help="offered / budget, comma list")
    ap.add_argument("--max", type=int, default=2_000_000, help="the budget per window")
    ap.add_argument("--window-s", type=int, default=86_400, help="the window (a day)")
    ap.add_argument("--windows", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    args = ap.parse_args(argv)
    base = SimParams(max=args.max, window_ms=args.window_s * 1000, windows=args.windows)
    base = replace(base, skew_ms=50, latency_ms=1)
    rows = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        for load in (float(x) for x in args.loads.split(",")):
            params = replace(base, nodes=nodes, load=load, rate=rate_for(base, load))
            rows += [measure(params, name, args.seeds) for name in args.systems.split(",")]
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

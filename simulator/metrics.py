"""What a run measured, and the definitions behind every number (docs/ACCURACY.md repeats them).

All times are the true (store) clock; windows are true windows `[start + kW, start + (k+1)W)`,
which is what clients experience whatever the nodes' clocks say.

* admitted per window: admitted requests whose arrival falls in the true window.
* crossing of window k: the arrival time of its MAX-th admitted request; from then on every
  admission in window k is overshoot.
* lag (per node): for each window with a crossing and each node that got a request after
  it, the time from the crossing to that node's first OVER_LIMIT in the same window. Pairs
  whose node never rejected before the window ended are counted as `unblocked` instead.
* false rejection: a request rejected although (1) fewer than MAX requests had arrived in its
  window before it (the true global count, admitted or not: an exact counter would admit
  it) and (2) it arrived at least C + slack after the latest request that found its window
  already at MAX (by demand or by admissions): every such request may legitimately start or
  re-arm a cooldown, as the exact counter and the core both do. slack = one span + the store
  latency + the clock spread: the time a correct block needs to reach every node. The rate
  is false rejections / eligible requests (those meeting (1) and (2), admitted or not).
  Under the limit every request is eligible.
* nodes error: |nodes - global/local share| / that share, sampled after every store answer.
* store per request: the keys store calls carried (a batched sync counts once per key it
  carries; the exact counter, one call per request) / requests offered.

Per-rule measures, for every algorithm (the columns `--algorithm` shows). The exact reference
of the run's algorithm (references.py) decides every arrival centrally, alongside the system:

* worst trailing-window admitted: the maximum over all instants t of the admitted requests
  with arrival in (t - W, t] (reached at an admission, so checked at each). `trail` is the
  system's, `exact` the reference's on the same arrivals; pooled seeds take the maximum of each.
* overshoot vs exact: trail / exact - 1. overshoot vs the limit: trail / bound - 1, where
  bound is what the exact rule can admit in a trailing window: MAX for the window algorithms,
  burst + requests_per_unit for the token bucket (a full bucket, then one window's refill).
* false rejection vs exact: a request the system refused that the reference admitted at that
  time (as it decides it, on the same arrivals and its own admissions). The rate is over the
  requests the reference admitted. Under the limit the reference admits everything (`exact
  rej` = 0 shows it), so there every rejection is a false one. Over the limit it is a
  comparison of two deciders, not of a truth: a system that admitted more earlier can refuse
  a request the reference, having admitted less, takes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass(frozen=True)
class Summary:
    scenario: str
    system: str
    max: int
    windows: int
    offered_per_window: float
    admitted_mean: float
    admitted_p95: float
    admitted_max: int
    overshoot_max_pct: float  # (worst window - MAX) / MAX, 0 if never over
    overshoot_mean_pct: float  # mean over windows of max(0, admitted - MAX) / MAX
    windows_over: int
    lag_mean_ms: float
    lag_p95_ms: float
    unblocked: int  # (window, node) pairs exposed after a crossing that never rejected
    exposed: int
    false_rejections: int
    eligible: int
    false_rejection_pct: float
    nodes_error_pct: float | None  # None: the system has no nodes estimate
    dropped_hits: int
    store_per_request: float = 0.0  # keys carried by store calls / requests offered
    cpu_s: float = 0.0
    algorithm: str = "fixed_window"
    bound: int = 0  # the most the exact rule admits in a trailing window
    trailing_max: int = 0  # worst trailing-window admitted, this system
    trailing_exact: int = 0  # ... the exact reference on the same arrivals
    trailing_over_exact_pct: float = 0.0
    trailing_over_bound_pct: float = 0.0
    false_vs_exact: int = 0  # refused here, admitted by the reference
    exact_admitted: int = 0
    exact_rejected: int = 0
    false_vs_exact_pct: float = 0.0


class Recorder:
    """Per-request bookkeeping; kept to a few dict and list operations per call."""

    def __init__(self, start: int, window_ms: int, spans: int, windows: int, max_: int) -> None:
        self.start, self.window_ms, self.spans, self.max = start, window_ms, spans, max_
        self.allowance = 0  # C + slack; set by the engine
        self.admitted = [0] * windows
        self.offered = [0] * windows
        self.offered_span = [0] * (windows * spans)
        self.admitted_span = [0] * (windows * spans)
        self.crossing: list[int | None] = [None] * windows
        self.last_anchor = -(10**18)  # latest request that found its window at MAX
        self.first_reject: dict[tuple[int, int], int] = {}
        self.exposed: set[tuple[int, int]] = set()
        self.false_rejections = 0
        self.eligible = 0
        self.nodes_errors: list[float] = []
        self.dropped_hits = 0
        self.store_calls = 0  # keys carried by store calls: a batch counts once per key
        self.algorithm, self.bound = "fixed_window", max_  # set by the engine
        self.admitted_times: list[int] = []  # arrivals of admitted requests, in order
        self.exact_times: list[int] = []  # ... of those the exact reference admitted
        self.false_vs_exact = 0

    def request(self, t: int, node: int, ok: bool) -> None:
        offset = t - self.start
        w = offset // self.window_ms
        b = w * self.spans + (offset % self.window_ms) * self.spans // self.window_ms
        self.offered_span[b] += 1
        demand = self.offered[w]
        self.offered[w] = demand + 1
        if demand >= self.max:
            self.last_anchor = t  # over the limit: a cooldown may start or re-arm from here
        elif t >= self.last_anchor + self.allowance:
            self.eligible += 1
            self.false_rejections += not ok
        crossed = self.crossing[w]
        if crossed is not None:
            self._lag(w, node, t - crossed, ok)
        if ok:
            self.admitted_span[b] += 1
            self.admitted[w] += 1
            if self.admitted[w] == self.max:
                self.crossing[w] = t

    def versus(self, t: int, ok: bool, exact: bool) -> None:
        """The system's decision next to the exact reference's, on the same arrival."""
        if ok:
            self.admitted_times.append(t)
        if exact:
            self.exact_times.append(t)
            self.false_vs_exact += not ok

    def _lag(self, w: int, node: int, since: int, ok: bool) -> None:
        pair = (w, node)
        if pair in self.first_reject:
            return
        self.exposed.add(pair)
        if not ok:
            self.first_reject[pair] = since

    def nodes_sample(self, estimate: float, truth: float) -> None:
        self.nodes_errors.append(abs(estimate - truth) / truth)


def worst_trailing(times: list[int], window_ms: int) -> int:
    """max over t of #{s in times : t - W < s <= t}, for `times` in order."""
    worst, first = 0, 0
    for last, t in enumerate(times):
        while times[first] <= t - window_ms:
            first += 1
        worst = max(worst, last - first + 1)
    return worst


def _pct(value: float, of: float) -> float:
    return 100 * (value / of - 1) if of else 0.0


def trailing(recs: list[Recorder]) -> dict[str, Any]:
    """The per-rule measures of pooled runs (the `Summary` fields they fill)."""
    first = recs[0]
    worst = max(worst_trailing(r.admitted_times, r.window_ms) for r in recs)
    exact = max(worst_trailing(r.exact_times, r.window_ms) for r in recs)
    false, admitted = sum(r.false_vs_exact for r in recs), sum(len(r.exact_times) for r in recs)
    return {
        "algorithm": first.algorithm,
        "bound": first.bound,
        "trailing_max": worst,
        "trailing_exact": exact,
        "trailing_over_exact_pct": _pct(worst, exact),
        "trailing_over_bound_pct": _pct(worst, first.bound),
        "false_vs_exact": false,
        "exact_admitted": admitted,
        "exact_rejected": sum(sum(r.offered) for r in recs) - admitted,
        "false_vs_exact_pct": 100 * false / max(1, admitted),
    }


def summarize(recs: list[Recorder], scenario: str, system: str, has_nodes: bool) -> Summary:
    """Pool several runs (seeds) of one system: windows, rejections and samples add up."""
    first = recs[0]
    adm = [a for r in recs for a in r.admitted]
    over = [max(0, a - first.max) for a in adm]
    lags = [float(v) for r in recs for v in r.first_reject.values()]
    errors = [e for r in recs for e in r.nodes_errors]
    false, eligible = sum(r.false_rejections for r in recs), sum(r.eligible for r in recs)
    exposed = sum(len(r.exposed) for r in recs)
    return Summary(
        scenario=scenario,
        system=system,
        max=first.max,
        windows=len(adm),
        offered_per_window=sum(sum(r.offered) for r in recs) / len(adm),
        admitted_mean=sum(adm) / len(adm),
        admitted_p95=percentile([float(a) for a in adm], 95),
        admitted_max=max(adm),
        overshoot_max_pct=100 * max(over) / first.max,
        overshoot_mean_pct=100 * sum(over) / len(over) / first.max,
        windows_over=sum(1 for o in over if o),
        lag_mean_ms=sum(lags) / len(lags) if lags else 0.0,
        lag_p95_ms=percentile(lags, 95),
        unblocked=exposed - len(lags),
        exposed=exposed,
        false_rejections=false,
        eligible=eligible,
        false_rejection_pct=100 * false / max(1, eligible),
        nodes_error_pct=100 * sum(errors) / len(errors) if has_nodes and errors else None,
        dropped_hits=sum(r.dropped_hits for r in recs),
        store_per_request=sum(r.store_calls for r in recs)
        / max(1, sum(sum(r.offered) for r in recs)),
        **trailing(recs),
    )

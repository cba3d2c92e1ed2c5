"""Servers against a baseline measured in the same rounds (pure): the median over rounds of
server / baseline within a round (RPS and p99); with `by_cpu`, RPS per server CPU-second decides
when a server was not CPU-bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from bench.load import runs
from bench.load.runs import SATURATED_PCT, Run
from bench.report import fmt, pct, table


@dataclass(frozen=True, slots=True)
class Comparison:
    workload: str
    client: str
    server: str
    baseline: str
    ratio: float | None  # the deciding median over rounds of server / baseline; None: unmeasured
    basis: str  # "RPS" or "RPS per CPU-s"
    per_round: tuple[float, ...]  # the deciding ratio of each round
    p99_ratio: float | None  # median over rounds of server p99 / baseline p99
    p99_per_round: tuple[float, ...]
    server_row: Run | None  # pooled over every round
    baseline_row: Run | None
    noisy: bool  # other load on the server CPU in either pooled row
    errors: int  # failed requests of both

    @property
    def spread(self) -> str:
        """The lowest and highest single round, e.g. "88.0 % .. 95.1 %"."""
        if not self.per_round:
            return "-"
        return f"{min(self.per_round):.1%} .. {max(self.per_round):.1%}"

    def passed(self, target: float, p99_no_worse: bool = False) -> bool | None:
        """Met (ratio ≥ target and, if asked, the median p99 ratio ≤ 1); None when it cannot
        be judged (not measured, failed requests, other load on the server CPU)."""
        if self.ratio is None or self.errors or self.noisy:
            return None
        if p99_no_worse and (self.p99_ratio is None or self.p99_ratio > 1.0):
            return False
        return self.ratio >= target


def saturated(*pooled: Run) -> bool:
    """Every one CPU-bound: its RPS is its capacity."""
    return min(r.cpu.server_pct for r in pooled) >= SATURATED_PCT


def _p99(run: Run) -> float:
    return run.latency.p99_ms


def compare(
    measured: Sequence[Run],
    server: str,
    baseline: str,
    workload: str,
    client: str,
    *,
    by_cpu: bool = False,
) -> Comparison:
    """`server` against `baseline` in `workload` as `client` measured them."""
    mine = [r for r in measured if r.workload == workload and r.client == client]
    pooled = {r.server: r for r in runs.rows(mine)}
    ours, theirs = pooled.get(server), pooled.get(baseline)
    rps = runs.ratios(mine, server, baseline, client)
    basis, deciding = "RPS", rps
    if by_cpu and ours is not None and theirs is not None and not saturated(ours, theirs):
        per_cpu = runs.ratios(mine, server, baseline, client, lambda r: r.per_cpu_second)
        basis, deciding = "RPS per CPU-s", per_cpu
    p99 = runs.ratios(mine, server, baseline, client, _p99)
    noisy = any(r is not None and r.cpu.noisy for r in (ours, theirs))
    errors = sum(r.errors for r in (ours, theirs) if r is not None)
    return Comparison(
        workload,
        client,
        server,
        baseline,
        runs.median(deciding),
        basis,
        deciding,
        runs.median(p99),
        p99,
        ours,
        theirs,
        noisy,
        errors,
    )


def as_json(c: Comparison) -> dict[str, object]:
    """The comparison without its pooled rows (the section's document has those)."""
    names = [f.name for f in fields(Comparison) if not f.name.endswith("_row")]
    return {name: getattr(c, name) for name in names}


def verdict_word(comparison: Comparison, target: float, p99_no_worse: bool = False) -> str:
    passed = comparison.passed(target, p99_no_worse)
    if passed is None:
        if comparison.ratio is None:
            return "NOT MEASURED"
        return "INVALID (failed requests)" if comparison.errors else "INCONCLUSIVE (other load)"
    return "PASS" if passed else "FAIL"


HEADER: tuple[str, ...] = ("workload", "client", "server", "RPS", "p99 ms", "ratio", "basis")
HEADER += ("rounds", "round range", "p99 ratio", "verdict")


def comparison_table(
    comparisons: Sequence[Comparison], target: float, p99_no_worse: bool = False
) -> str:
    """One line per comparison: the server's pooled RPS and p99, the deciding median ratio to
    the baseline, its basis and range over rounds, the median p99 ratio and the verdict."""
    rows = []
    for c in comparisons:
        row = c.server_row
        rows.append(
            [
                c.workload,
                c.client,
                c.server,
                fmt(row.rps if row else None),
                fmt(row.latency.p99_ms if row else None, 2),
                pct(c.ratio),
                c.basis,
                str(len(c.per_round)),
                c.spread,
                fmt(c.p99_ratio, 2),
                verdict_word(c, target, p99_no_worse),
            ]
        )
    return table(HEADER, rows)

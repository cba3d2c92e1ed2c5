"""Servers against a baseline measured in the same rounds (pure): the median over rounds of
server / baseline within a round (RPS and p99); with `by_cpu`, RPS per server CPU-second decides
when a server was not CPU-bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

from bench.load import runs
from bench.load.runs import SATURATED_PCT, Bench, Run
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
    server_row: Run | None  # pooled over every round
    noisy: bool  # other load on the server CPU in either pooled row
    errors: int  # failed requests of both
    target: float | None  # the least ratio that passes; None: shown, not judged
    p99_no_worse: bool  # the target also asks for a median p99 ratio ≤ 1

    @property
    def spread(self) -> str:
        """The lowest and highest single round, e.g. "88.0 % .. 95.1 %"."""
        if not self.per_round:
            return "-"
        return f"{min(self.per_round):.1%} .. {max(self.per_round):.1%}"

    @property
    def passed(self) -> bool | None:
        """None when not judged: no target, not measured, failed requests, other load."""
        if self.target is None or self.ratio is None or self.errors or self.noisy:
            return None
        if self.p99_no_worse and (self.p99_ratio is None or self.p99_ratio > 1.0):
            return False
        return self.ratio >= self.target

    @property
    def verdict(self) -> str:
        if self.target is None:
            return "-"
        if self.passed is not None:
            return "PASS" if self.passed else "FAIL"
        if self.ratio is None:
            return "NOT MEASURED"
        return "INVALID (failed requests)" if self.errors else "INCONCLUSIVE (other load)"


def compare(
    measured: Sequence[Run],
    server: str,
    baseline: str,
    workload: str,
    client: str,
    *,
    target: float | None = None,
    by_cpu: bool = False,
    p99_no_worse: bool = False,
) -> Comparison:
    """`server` against `baseline` in `workload` as `client` measured them."""
    mine = [r for r in measured if r.workload == workload and r.client == client]
    pooled = {r.server: r for r in runs.rows(mine)}
    ours, theirs = pooled.get(server), pooled.get(baseline)
    both = [r for r in (ours, theirs) if r is not None]
    basis, deciding = "RPS", runs.ratios(mine, server, baseline, client)
    if by_cpu and len(both) == 2 and min(r.cpu.server_pct for r in both) < SATURATED_PCT:
        per_cpu = runs.ratios(mine, server, baseline, client, lambda r: r.per_cpu_second)
        basis, deciding = "RPS per CPU-s", per_cpu
    p99 = runs.ratios(mine, server, baseline, client, lambda r: r.latency.p99_ms)
    return Comparison(
        workload, client, server, baseline, runs.median(deciding), basis, deciding,
        runs.median(p99), ours, any(r.cpu.noisy for r in both), sum(r.errors for r in both),
        target, p99_no_worse,
    )  # fmt: skip


def against(
    measured: Sequence[Run],
    baseline: str,
    servers: Sequence[str],
    *,
    target: float | None = None,
    by_cpu: bool = False,
    p99_no_worse: bool = False,
) -> list[Comparison]:
    """Each of `servers` against `baseline`, in every workload and client measured."""
    where = dict.fromkeys((r.workload, r.client) for r in measured)
    judged = partial(compare, target=target, by_cpu=by_cpu, p99_no_worse=p99_no_worse)
    return [judged(measured, s, baseline, w, c) for w, c in where for s in servers]


def as_json(c: Comparison) -> dict[str, object]:
    """The comparison without its pooled row (the section's document has those)."""
    found = {f.name: getattr(c, f.name) for f in fields(Comparison) if f.name != "server_row"}
    return {**found, "passed": c.passed}


HEADER: tuple[str, ...] = ("workload", "client", "server", "baseline", "RPS", "p99 ms", "ratio")
HEADER += ("basis", "rounds", "round range", "p99 ratio", "target", "verdict")


def comparison_table(comparisons: Sequence[Comparison]) -> str:
    """One line per comparison: the server's pooled RPS and p99, the deciding median ratio to
    the baseline, its basis and range over rounds, the median p99 ratio and the verdict."""
    rows = [
        [
            c.workload, c.client, c.server, c.baseline,
            fmt(c.server_row.rps if c.server_row else None),
            fmt(c.server_row.latency.p99_ms if c.server_row else None, 2),
            pct(c.ratio), c.basis, str(len(c.per_round)), c.spread, fmt(c.p99_ratio, 2),
            "-" if c.target is None else f"≥ {c.target:.0%}" + (", p99" if c.p99_no_worse else ""),
            c.verdict,
        ]
        for c in comparisons
    ]  # fmt: skip
    return f"{table(HEADER, rows, left=4)}\n{LEGEND}"


LEGEND = """\
ratio = median over rounds of server / baseline in the same round (basis: RPS, or RPS per second
of server CPU when one was not CPU-bound); round range = the lowest and highest single round; p99
ratio = the same for p99; target: the least ratio that passes (p99: also a p99 ratio ≤ 1)."""


def report(
    bench: Bench,
    measured: Sequence[Run],
    rounds: int,
    found: Sequence[Comparison],
    *,
    columns: Sequence[runs.Column] = (),
    legend: str = "",
    skipped: Sequence[str] = (),
) -> tuple[list[str], dict[str, Any]]:
    """The load table (with the section's columns and legend), then the comparisons; the
    results document with both."""
    lines = runs.render(bench, measured, rounds, columns, legend, skipped=skipped)
    document = runs.document(bench, measured, rounds, skipped)
    document["comparisons"] = [as_json(c) for c in found]
    return [*lines, "", comparison_table(found)], document


def verdicts(comparisons: Sequence[Comparison]) -> list[bool | None]:
    return [c.passed for c in comparisons]

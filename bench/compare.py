"""What a load section reports (pure): its pooled runs as a table, and servers against a
baseline measured in the same rounds, the median over rounds of server / baseline within a round
(RPS and p99; with `by_cpu`, RPS per server CPU-second decides when a server was not CPU-bound).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from bench.load import runs
from bench.load.runs import SATURATED_PCT, Bench, Run
from bench.report import fmt, passing, pct, table


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
        if self.passed is not None or self.ratio is None:
            return passing(self.passed)
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
    measured: Sequence[Run], baseline: str, servers: Sequence[str], **judged: Any
) -> list[Comparison]:
    """Each of `servers` against `baseline` (`compare`'s `judged` keywords), in every workload
    and client measured."""
    where = dict.fromkeys((r.workload, r.client) for r in measured)
    return [compare(measured, s, baseline, w, c, **judged) for w, c in where for s in servers]


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


LOAD_HEADER: tuple[str, ...] = ("workload", "client", "server", "RPS", "p50 ms", "p99 ms")
LOAD_HEADER += ("server CPU %", "client CPU %", "other CPU % s/c", "CPU µs/req", "errors")
LOAD_LEGEND = """\
RPS and CPU pool every round; latency percentiles pool every request (wrk: medians of the
rounds' percentiles); CPU % of one core; CPU µs/req = server CPU time per request; other CPU %
s/c = work by anything else on the server's / the load generators' CPU (unpinned: anywhere)."""
LOADGEN_BUSY_PCT, CLIENT_SHARED_PCT = 90.0, 20.0
Column = tuple[str, Callable[[Run], str]]  # a section's extra column: header, cell of a row


def cells(row: Run) -> list[str]:
    other = f"{fmt(row.cpu.other_on_server_cpu_pct)}/{fmt(row.cpu.other_on_client_cpu_pct)}"
    return [
        row.workload, row.client, row.server, fmt(row.rps), fmt(row.latency.p50_ms, 2),
        fmt(row.latency.p99_ms, 2), fmt(row.cpu.server_pct), fmt(row.cpu.client_pct), other,
        fmt(row.cpu_us()), str(row.errors),
    ]  # fmt: skip


def notes(bench: Bench, row: Run) -> list[str]:
    found, load = list(row.notes), row.cpu
    if row.errors:
        found.append(f"{row.errors} failed requests, first: {row.first_error}")
    if load.noisy:
        found.append(f"other load on the server CPU: {load.other_on_server_cpu_pct:.0f}%")
    elif bench.pinning.pinned and load.server_pct < SATURATED_PCT:
        found.append(f"server used {load.server_pct:.0f}% of its core: not saturated")
    if load.client_pct >= LOADGEN_BUSY_PCT:
        found.append(f"load generator at {load.client_pct:.0f}% CPU: may be the limit")
    if (load.other_on_client_cpu_pct or 0.0) >= CLIENT_SHARED_PCT:
        found.append(f"the load generators' CPU ran {load.other_on_client_cpu_pct:.0f}% other work")
    return [f"{row.workload}/{row.client}/{row.server}: {note}" for note in found]


def run_json(run: Run) -> dict[str, Any]:
    fields = {k: v for k, v in asdict(run).items() if k != "latencies_ms"}
    return {**fields, "rps": run.rps, "cpu_us_per_request": run.cpu_us(), "noisy": run.cpu.noisy}


def report(
    bench: Bench,
    measured: Sequence[Run],
    found: Sequence[Comparison] = (),
    *,
    columns: Sequence[Column] = (),
    legend: str = "",
) -> tuple[list[str], dict[str, Any]]:
    """The load, its pooled rows (with the section's columns), legend and notes, then the
    comparisons if any; the results document with the setup, rows, runs and comparisons."""
    shape, pooled, skipped = bench.shape, runs.rows(measured), bench.skipped
    body = [cells(row) + [cell(row) for _, cell in columns] for row in pooled]
    settle = f" (after {shape.settle_s:g} s settle)" if shape.settle_s else ""
    lines = [
        f"\n{shape.connections} connections x {shape.streams} in flight; {bench.rounds} rounds of "
        f"{shape.duration_s:g} s per row{settle}; pinning: {bench.pinning.describe()}",
        table((*LOAD_HEADER, *(name for name, _ in columns)), body),
        LOAD_LEGEND + (f"\n{legend}" if legend else ""),
    ]
    lines += [f"  note: {n}" for row in pooled for n in notes(bench, row)]
    lines += [f"  not measured: {s}" for s in skipped]
    document = {
        "skipped": list(skipped), "pinning": bench.pinning.describe(), "shape": asdict(shape),
        "rounds": bench.rounds, "rows": [run_json(row) for row in pooled],
        "runs": [run_json(run) for run in measured], "comparisons": [as_json(c) for c in found],
    }  # fmt: skip
    return [*lines, "", comparison_table(found)] if found else lines, document


def verdicts(comparisons: Sequence[Comparison]) -> list[bool | None]:
    return [c.passed for c in comparisons]

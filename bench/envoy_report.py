"""The Envoy end-to-end section's runs, pooled rows, verdict, table and JSON document."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.cpu import Pinning
from bench.cpuwatch import NOISE_LIMIT_PCT
from bench.envoy_stack import HEADERS, RULES_YAML
from bench.report import fmt, table, write_json
from bench.wrk_driver import WrkResult

TARGET_RATIO = 0.90
SATURATED_PCT = 95.0  # Envoy + service at least this busy: the server CPU is the limit
RLS_FAILURES = ("error", "failure_mode_allowed")
BASELINES = ("empty", "empty-4")  # the first decides PASS/FAIL; the others are cross-checks


@dataclass(frozen=True, slots=True)
class CpuUse:
    """% of one core over the sampled part of a run; `other` is foreign work on the server CPU."""

    wall_s: float
    envoy_pct: float
    service_pct: float
    wrk_pct: float
    other_on_server_cpu_pct: float | None


@dataclass(frozen=True, slots=True)
class Run:
    round_no: int
    service: str
    wrk: WrkResult
    ratelimit: dict[str, int]  # Envoy's ratelimit filter counters over the run
    cpu: CpuUse
    quiet: bool  # no foreign work on our CPUs just before the run

    def problems(self) -> list[str]:
        found = []
        if self.wrk.non_2xx:
            found.append(f"{self.wrk.non_2xx} non-2xx responses")
        if self.wrk.socket_errors:
            found.append(f"{self.wrk.socket_errors} socket errors")
        failures = sum(self.ratelimit[name] for name in RLS_FAILURES)
        if failures:
            found.append(f"{failures} rate-limit calls failed (Envoy failed open)")
        if self.ratelimit["over_limit"]:
            found.append(f"{self.ratelimit['over_limit']} OVER_LIMIT answers")
        if self.ratelimit["ok"] < self.wrk.requests:
            found.append(f"only {self.ratelimit['ok']} OK answers for {self.wrk.requests} requests")
        return found


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if len(known) == len(values) and known else None


@dataclass(frozen=True, slots=True)
class Row:
    """Every round of one service pooled: RPS over all requests, latency medians over rounds."""

    service: str
    runs: int
    requests: int
    duration_s: float
    p50_ms: float
    p99_ms: float  # median of the rounds' p99 (wrk reports percentiles per run)
    p99_worst_ms: float
    non_2xx: int
    socket_errors: int
    rls_failures: int
    envoy_pct: float
    service_pct: float
    wrk_pct: float
    other_pct: float | None
    problems: list[str] = field(default_factory=list)

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    def cpu_us_per_request(self, pct: float) -> float | None:
        return pct / 100 / self.rps * 1e6 if self.rps > 0 else None

    @property
    def saturated(self) -> bool:
        return self.envoy_pct + self.service_pct >= SATURATED_PCT

    @property
    def noisy(self) -> bool:
        return self.other_pct is not None and self.other_pct > NOISE_LIMIT_PCT


def pool(runs: Sequence[Run]) -> Row:
    return Row(
        service=runs[0].service,
        runs=len(runs),
        requests=sum(r.wrk.requests for r in runs),
        duration_s=sum(r.wrk.duration_s for r in runs),
        p50_ms=statistics.median(r.wrk.p50_ms for r in runs),
        p99_ms=statistics.median(r.wrk.p99_ms for r in runs),
        p99_worst_ms=max(r.wrk.p99_ms for r in runs),
        non_2xx=sum(r.wrk.non_2xx for r in runs),
        socket_errors=sum(r.wrk.socket_errors for r in runs),
        rls_failures=sum(r.ratelimit[name] for r in runs for name in RLS_FAILURES),
        envoy_pct=statistics.fmean(r.cpu.envoy_pct for r in runs),
        service_pct=statistics.fmean(r.cpu.service_pct for r in runs),
        wrk_pct=statistics.fmean(r.cpu.wrk_pct for r in runs),
        other_pct=_mean([r.cpu.other_on_server_cpu_pct for r in runs]),
        problems=sorted({p for r in runs for p in r.problems()}),
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    baseline: str
    primary: bool  # False: a cross-check, shown but not judged
    ratio: float | None  # median over rounds of sidecar RPS / baseline RPS (same round)
    pooled_ratio: float | None
    round_ratios: tuple[float, ...]
    passed: bool | None  # None: not judged (cross-check, not measured, invalid or noisy)
    summary: str


def round_ratios(runs: Sequence[Run], baseline: str) -> tuple[float, ...]:
    by_round: dict[int, dict[str, float]] = {}
    for run in runs:
        by_round.setdefault(run.round_no, {})[run.service] = run.wrk.rps
    pairs = [(r.get("sidecar"), r.get(baseline)) for r in by_round.values()]
    return tuple(s / b for s, b in pairs if s is not None and b)


def _decide(sidecar: Row, base: Row, ratio: float, primary: bool) -> tuple[bool | None, str]:
    if sidecar.problems:
        return (False if primary else None), "FAIL: invalid runs"
    if base.problems:
        return None, "not judged: invalid baseline runs"
    if sidecar.noisy or base.noisy:
        return None, "not judged: busy machine"
    passed = ratio >= TARGET_RATIO
    word = "PASS" if passed else "FAIL"
    return (passed if primary else None), (word if primary else f"cross-check, would {word}")


def judge(rows: dict[str, Row], runs: Sequence[Run], baseline: str, primary: bool) -> Verdict:
    sidecar, base, ratios = rows.get("sidecar"), rows.get(baseline), round_ratios(runs, baseline)
    if sidecar is None or base is None or not ratios or base.rps <= 0:
        summary = f"sidecar vs {baseline}: not measured"
        return Verdict(baseline, primary, None, None, ratios, None, summary)
    ratio, pooled = statistics.median(ratios), sidecar.rps / base.rps
    passed, word = _decide(sidecar, base, ratio, primary)
    text = (
        f"sidecar vs {baseline}: {word}: RPS {ratio:.1%} of {baseline}'s (median of "
        f"{len(ratios)} rounds; pooled {pooled:.1%}); target ≥ {TARGET_RATIO:.0%}"
    )
    return Verdict(baseline, primary, ratio, pooled, ratios, passed, text)


@dataclass(frozen=True, slots=True)
class Report:
    runs: Sequence[Run]
    pinning: Pinning
    machine: dict[str, Any]
    connections: int
    seconds: int
    rounds: int
    elapsed_s: float
    skipped: str | None = None

    @property
    def rows(self) -> dict[str, Row]:
        groups: dict[str, list[Run]] = {}
        for run in self.runs:
            groups.setdefault(run.service, []).append(run)
        return {name: pool(group) for name, group in groups.items()}

    @property
    def verdicts(self) -> list[Verdict]:
        rows = self.rows
        return [judge(rows, self.runs, name, name == BASELINES[0]) for name in BASELINES]

    @property
    def passed(self) -> bool | None:
        return next((v.passed for v in self.verdicts if v.primary), None)


HEADER = (
    "path",
    "service",
    "rounds",
    "RPS",
    "p50 ms",
    "p99 ms",
    "non-2xx",
    "sock err",
    "RLS fail",
    "Envoy CPU %",
    "svc CPU %",
    "other CPU %",
    "Envoy µs/req",
    "svc µs/req",
    "vs empty",
    "vs empty-4",
    "target",
)


def _ratio(verdict: Verdict) -> str:
    return "" if verdict.ratio is None else f"{verdict.ratio:.1%}"


def _cells(row: Row, report: Report) -> list[str]:
    ratios, word = ["", ""], ""
    if row.service == "sidecar":
        verdicts = report.verdicts
        ratios = [_ratio(v) for v in verdicts]
        word = {True: "PASS", False: "FAIL", None: "n/j"}[verdicts[0].passed]
    return [
        f"wrk -c{report.connections} → Envoy →",
        row.service,
        f"{row.runs} x {report.seconds}s",
        fmt(row.rps),
        fmt(row.p50_ms, 2),
        fmt(row.p99_ms, 2),
        str(row.non_2xx),
        str(row.socket_errors),
        str(row.rls_failures),
        fmt(row.envoy_pct),
        fmt(row.service_pct),
        fmt(row.other_pct),
        fmt(row.cpu_us_per_request(row.envoy_pct)),
        fmt(row.cpu_us_per_request(row.service_pct)),
        *ratios,
        word,
    ]


def render(report: Report) -> str:
    return table(HEADER, [_cells(row, report) for row in report.rows.values()])


LEGEND = """\
RPS pools every round; p50/p99 are medians of the rounds' wrk percentiles; vs X = median over
rounds of sidecar RPS / X's RPS (same round); target: sidecar >= 90% of empty (empty-4 answers
one status per descriptor, like the sidecar: a cross-check); RLS fail = Envoy's ratelimit
error + failure_mode_allowed counters (fail-open); CPU % of one core; µs/req = CPU time per
request; other CPU % = work by anything else on the server CPU."""


def notes(report: Report) -> list[str]:
    found = []
    for row in report.rows.values():
        found += [f"{row.service}: {p}" for p in row.problems]
        if row.noisy:
            found.append(f"{row.service}: other load on the server CPU {row.other_pct:.0f}%")
        if not row.saturated:
            busy = row.envoy_pct + row.service_pct
            found.append(f"{row.service}: Envoy + service used {busy:.0f}% of their core")
    if any(not run.quiet for run in report.runs):
        found.append("the machine was busy before some runs (other work on our CPUs)")
    return found


def print_report(report: Report) -> None:
    print()
    print(
        f"wrk -t1 -c{report.connections} (HTTP/1.1, x-api-key: bench) → Envoy --concurrency 1 "
        f"→ rate-limit service; {report.rounds} rounds of {report.seconds}s; "
        f"pinning: {report.pinning.describe()}"
    )
    if report.runs:
        print(render(report))
        print(LEGEND)
    for note in notes(report):
        print(f"  note: {note}")
    if report.skipped:
        print(f"envoy: not measured: {report.skipped}")
    for verdict in report.verdicts:
        print(f"envoy: {verdict.summary}")
    print(f"section time: {report.elapsed_s:.0f}s")


def _run_json(run: Run) -> dict[str, Any]:
    return {
        "round": run.round_no + 1,
        "service": run.service,
        "rps": run.wrk.rps,
        "wrk": asdict(run.wrk),
        "envoy_ratelimit": run.ratelimit,
        "cpu": asdict(run.cpu),
        "quiet_before": run.quiet,
        "problems": run.problems(),
    }


def _row_json(row: Row) -> dict[str, Any]:
    return {
        **asdict(row),
        "rps": row.rps,
        "envoy_cpu_us_per_request": row.cpu_us_per_request(row.envoy_pct),
        "service_cpu_us_per_request": row.cpu_us_per_request(row.service_pct),
        "saturated": row.saturated,
        "noisy": row.noisy,
    }


def write_results(path: Path, report: Report) -> Path:
    document = {
        "section": "envoy",
        "issue": 4,
        "target": "wrk → Envoy → sidecar RPS >= 90% of wrk → Envoy → empty grpc.aio service",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": report.elapsed_s,
        "machine": report.machine,
        "pinning": {**asdict(report.pinning), "description": report.pinning.describe()},
        "load": {
            "command": f"wrk -t 1 -c {report.connections} -d {report.seconds}s --latency "
            + " ".join(f"-H '{h}'" for h in HEADERS),
            "rounds": report.rounds,
        },
        "sidecar_rules": RULES_YAML,
        "table": render(report) if report.runs else "",
        "rows": [_row_json(row) for row in report.rows.values()],
        "runs": [_run_json(run) for run in report.runs],
        "passed": report.passed,
        "verdicts": [asdict(v) for v in report.verdicts],
        "notes": notes(report),
        "skipped": report.skipped,
    }
    return write_json(path.name, document, path.parent)

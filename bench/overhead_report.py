"""The overhead section's table, notes and JSON document."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.cpu import Pinning
from bench.cpuwatch import NOISE_LIMIT_PCT
from bench.decide_cost import DecideCost, describe
from bench.loadgen import LoadShape
from bench.overhead_verdict import SATURATED_PCT, Runs, Verdict, pct, pooled
from bench.report import fmt, table, write_json
from bench.rls_load import Measurement

LOADGEN_BUSY_PCT = 90.0
CLIENT_SHARED_PCT = 20.0


@dataclass(frozen=True, slots=True)
class Skipped:
    workload: str
    client: str
    reason: str


@dataclass(frozen=True, slots=True)
class Report:
    runs: Runs
    skipped: Sequence[Skipped]
    judged: Sequence[Verdict]
    shape: LoadShape
    pinning: Pinning
    elapsed_s: float
    machine: dict[str, Any]  # described before this process pinned itself
    decide_costs: Sequence[DecideCost] = ()
    untargeted: Sequence[str] = ()  # workloads shown for information, without a target


def notes_for(row: Measurement) -> list[str]:
    notes = list(row.notes)
    load = row.cpu
    if row.errors:
        notes.append(f"{row.errors} failed requests, first: {row.first_error}")
    if load.noisy:
        other = load.other_on_server_cpu_pct or 0.0
        notes.append(f"other load on the server CPU: {other:.0f}% (limit {NOISE_LIMIT_PCT:.0f}%)")
    elif load.server_pct < SATURATED_PCT:
        notes.append(f"server used {load.server_pct:.1f}% of its core: not saturated")
    if load.client_pct >= LOADGEN_BUSY_PCT:
        notes.append(f"load generator at {load.client_pct:.0f}% CPU: may be the limit")
    shared = load.other_on_client_cpu_pct
    if shared is not None and shared >= CLIENT_SHARED_PCT:
        notes.append(f"the load generator's CPU ran {shared:.0f}% other work")
    return notes


HEADER = (
    "workload",
    "client",
    "server",
    "RPS",
    "p50 ms",
    "p99 ms",
    "server CPU %",
    "client CPU %",
    "other CPU % s/c",
    "req/CPU-s",
    "ratio",
    "CPU-norm ratio",
    "errors",
)


def _cells(row: Measurement, verdict: Verdict | None) -> list[str]:
    other = f"{fmt(row.cpu.other_on_server_cpu_pct)}/{fmt(row.cpu.other_on_client_cpu_pct)}"
    return [
        row.workload,
        row.client,
        row.server,
        fmt(row.rps),
        fmt(row.latency.p50_ms, 2),
        fmt(row.latency.p99_ms, 2),
        fmt(row.cpu.server_pct),
        fmt(row.cpu.client_pct),
        other,
        fmt(row.requests_per_cpu_second),
        "" if verdict is None else pct(verdict.ratio),
        "" if verdict is None else pct(verdict.cpu_ratio),
        str(row.errors),
    ]


def render(rows: Sequence[Measurement], judged: Sequence[Verdict]) -> str:
    by_pair = {(v.workload, v.client): v for v in judged}
    cells = []
    for row in rows:
        verdict = by_pair.get((row.workload, row.client)) if row.server == "sidecar" else None
        cells.append(_cells(row, verdict))
    return table(HEADER, cells)


LEGEND = """\
RPS, latencies and CPU pool every round; ratio = median over rounds of sidecar RPS / empty RPS
(same workload, client and round); CPU-norm ratio = the same for RPS per second of server CPU;
req/CPU-s = RPS per second of server CPU; other CPU % s/c = work by anything else on the
server's / the load generator's CPU."""


def print_report(report: Report) -> None:
    rows, shape = pooled(report.runs), report.shape
    runs = rows[0].runs if rows else 0
    print()
    print(
        f"ShouldRateLimit, {shape.connections} connections x {shape.streams} streams "
        f"({shape.in_flight} in flight); {runs} rounds of {shape.duration_s:g}s per row "
        f"(after {shape.settle_s:g}s settle each); pinning: {report.pinning.describe()}"
    )
    print(render(rows, report.judged))
    print(LEGEND)
    for row in rows:
        for note in notes_for(row):
            print(f"  note: {row.workload}/{row.client}/{row.server}: {note}")
    for skip in report.skipped:
        print(f"  not measured: {skip.workload} with {skip.client}: {skip.reason}")
    for verdict in report.judged:
        summary = verdict.summary
        if verdict.workload in report.untargeted:
            role, summary = "no target", summary.split(": ", 1)[-1]  # no PASS/FAIL word
        else:
            role = "target" if verdict.primary else "cross-check"
        print(f"{verdict.workload} [{verdict.client}, {role}] {summary}")
    for line in describe(report.decide_costs) if report.decide_costs else []:
        print(line)
    print(f"section time: {report.elapsed_s:.0f}s")


def _row_json(row: Measurement) -> dict[str, Any]:
    return {
        "workload": row.workload,
        "client": row.client,
        "server": row.server,
        "rps": row.rps,
        "requests": row.requests,
        "duration_s": row.duration_s,
        "latency_ms": asdict(row.latency),
        "cpu": {**asdict(row.cpu), "noisy": row.cpu.noisy},
        "requests_per_server_cpu_second": row.requests_per_cpu_second,
        "errors": row.errors,
        "first_error": row.first_error,
        "probed_bodies": row.probed,
        "attempts": row.attempts,
        "runs": row.runs,
        "notes": notes_for(row),
    }


def write_results(path: Path, report: Report) -> Path:
    rows = pooled(report.runs)
    document = {
        "section": "overhead",
        "issue": 2,
        "target": "sidecar RPS >= 90% of the empty handler's, per workload",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": report.elapsed_s,
        "machine": report.machine,
        "pinning": {**asdict(report.pinning), "description": report.pinning.describe()},
        "shape": asdict(report.shape),
        "table": render(rows, report.judged),
        "rows": [_row_json(r) for r in rows],
        "runs": [{"round": n + 1, **_row_json(r)} for n, r in report.runs],
        "skipped": [asdict(s) for s in report.skipped],
        "verdicts": [{**asdict(v), "decisive": v.decisive} for v in report.judged],
        "decide_us_in_process": {c.case: c.us_per_decision for c in report.decide_costs},
    }
    return write_json(path.name, document, path.parent)

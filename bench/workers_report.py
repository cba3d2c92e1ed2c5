"""The workers section's runs, pooled rows, speed-up, metrics cost, table and JSON document."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.hotpath_cost import NOOP, Cost, added_per_request
from bench.latency import LatencySummary, summarize
from bench.loadgen import LoadShape
from bench.report import fmt, table, write_json

UNEVEN_SHARE = 0.6  # one worker serving more than this share: SO_REUSEPORT hashed unevenly


@dataclass(frozen=True, slots=True)
class FleetCpu:
    """% of one core (the machine has 100% per CPU) over the sampled part of a run."""

    wall_s: float
    sidecar_pct: float  # every sidecar process (supervisor and workers)
    client_pct: float  # h2load
    other_pct: float  # anything else on the machine


@dataclass(slots=True)
class Run:
    round_no: int
    workers: int
    requests: int
    duration_s: float
    errors: int
    first_error: str
    latencies_ms: list[float] = field(repr=False)
    cpu: FleetCpu
    served: list[int]  # decisions per worker, from each worker's /metrics
    quiet: bool

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s

    @property
    def shares(self) -> list[float]:
        total = sum(self.served)
        return [s / total for s in self.served] if total else []


@dataclass(frozen=True, slots=True)
class Row:
    workers: int
    runs: int
    rps: float
    latency: LatencySummary
    sidecar_pct: float
    client_pct: float
    other_pct: float
    shares: list[float]
    errors: int
    first_error: str

    @property
    def rps_per_sidecar_cpu(self) -> float | None:
        return self.rps / (self.sidecar_pct / 100) if self.sidecar_pct > 0 else None

    @property
    def cpu_us_per_request(self) -> float | None:
        return self.sidecar_pct / 100 / self.rps * 1e6 if self.rps > 0 else None


def pool(runs: Sequence[Run]) -> Row:
    served = [sum(col) for col in zip(*(r.served for r in runs), strict=True)]
    total = sum(served)
    errors = [r.first_error for r in runs if r.first_error]
    return Row(
        workers=runs[0].workers,
        runs=len(runs),
        rps=sum(r.requests for r in runs) / sum(r.duration_s for r in runs),
        latency=summarize(x for r in runs for x in r.latencies_ms),
        sidecar_pct=statistics.fmean(r.cpu.sidecar_pct for r in runs),
        client_pct=statistics.fmean(r.cpu.client_pct for r in runs),
        other_pct=statistics.fmean(r.cpu.other_pct for r in runs),
        shares=[s / total for s in served] if total else [],
        errors=sum(r.errors for r in runs),
        first_error=errors[0] if errors else "",
    )


@dataclass(frozen=True, slots=True)
class Speedup:
    median: float | None  # median over rounds of 2-worker RPS / 1-worker RPS (same round)
    pooled: float | None
    rounds: tuple[float, ...]


def speedup(runs: Sequence[Run], rows: dict[int, Row]) -> Speedup:
    by_round: dict[int, dict[int, float]] = {}
    for run in runs:
        by_round.setdefault(run.round_no, {})[run.workers] = run.rps
    ratios = tuple(r[2] / r[1] for r in by_round.values() if r.get(1) and 2 in r)
    pooled = rows[2].rps / rows[1].rps if 1 in rows and 2 in rows and rows[1].rps else None
    return Speedup(statistics.median(ratios) if ratios else None, pooled, ratios)


@dataclass(frozen=True, slots=True)
class Report:
    runs: Sequence[Run]
    costs: list[Cost]
    shape: LoadShape
    rounds: int
    machine: dict[str, Any]
    elapsed_s: float
    skipped: str | None = None

    @property
    def rows(self) -> dict[int, Row]:
        groups: dict[int, list[Run]] = {}
        for run in self.runs:
            groups.setdefault(run.workers, []).append(run)
        return {count: pool(group) for count, group in sorted(groups.items())}

    @property
    def speedup(self) -> Speedup:
        return speedup(self.runs, self.rows)


HEADER = (
    "workers",
    "client",
    "rounds",
    "RPS",
    "p50 ms",
    "p99 ms",
    "sidecar CPU %",
    "h2load CPU %",
    "other CPU %",
    "req/sidecar-CPU-s",
    "split",
    "errors",
    "speed-up",
)


def _cells(row: Row, report: Report) -> list[str]:
    gain = report.speedup.median if row.workers == 2 else None
    return [
        str(row.workers),
        f"h2load {report.shape.connections}x{report.shape.streams}",
        f"{row.runs} x {report.shape.duration_s:g}s",
        fmt(row.rps),
        fmt(row.latency.p50_ms, 2),
        fmt(row.latency.p99_ms, 2),
        fmt(row.sidecar_pct),
        fmt(row.client_pct),
        fmt(row.other_pct),
        fmt(row.rps_per_sidecar_cpu),
        "/".join(f"{s:.0%}" for s in row.shares),
        str(row.errors),
        "" if gain is None else f"{gain:.2f}x",
    ]


def render(report: Report) -> str:
    return table(HEADER, [_cells(row, report) for row in report.rows.values()])


def render_costs(costs: Sequence[Cost]) -> str:
    noop = next(c.us_per_call for c in costs if c.name == NOOP)
    cells = [
        [c.name, "", "", f"{c.us_per_call:.3f}", f"{c.us_per_call - noop:+.3f}"] for c in costs
    ]
    return table(("hot-path call", "", "", "µs/call", "vs no-op µs"), cells)


def metrics_summary(report: Report) -> str:
    added = added_per_request(report.costs)
    text = (
        f"metrics add {added['total_us']:.2f} µs per request: latency histogram "
        f"{added['latency_histogram_us']:.2f} µs (one more perf_counter + observe) + decision "
        f"counters {added['decision_counters_us']:.2f} µs (admitted, 1 descriptor)"
    )
    one = report.rows.get(1)
    per_request = one.cpu_us_per_request if one is not None else None
    if per_request:
        share = added["total_us"] / per_request
        text += f"; {share:.1%} of the {per_request:.0f} µs CPU per request of 1 worker under load"
    return text


LEGEND = """\
CPU % of one core (this machine has 2 cores = 200%), nothing pinned; RPS pools every round;
latency percentiles pool every request; split = decisions per worker (its /metrics);
speed-up = median over rounds of 2-worker RPS / 1-worker RPS (same round)."""


def notes(report: Report) -> list[str]:
    found = []
    for row in report.rows.values():
        if row.errors:
            found.append(f"{row.workers} worker(s): {row.errors} errors, first: {row.first_error}")
        if row.workers > 1 and row.shares and max(row.shares) > UNEVEN_SHARE:
            found.append(f"{row.workers} workers: uneven split {row.shares} (SO_REUSEPORT hash)")
    two = report.rows.get(2)
    if two is not None:
        found.append(
            f"the load generator shares the 2 cores with the workers: with 2 workers h2load took "
            f"{two.client_pct:.0f}% and other work {two.other_pct:.0f}% of the machine's 200%, "
            f"the workers {two.sidecar_pct:.0f}%; where the traffic comes from other machines "
            f"the workers would have more of the cores"
        )
    one = report.rows.get(1)
    if one is not None and one.sidecar_pct > 100:
        found.append(
            f"1 worker used {one.sidecar_pct:.0f}% CPU: gRPC's C-core threads run beside the "
            f"Python event loop, so even one process uses more than one core when it can"
        )
    if any(not run.quiet for run in report.runs):
        found.append("the machine was busy before some runs (other work on our CPUs)")
    return found


def print_report(report: Report) -> None:
    shape = report.shape
    print()
    print(
        f"sidecar --workers N, hot-10 ShouldRateLimit, h2load {shape.connections} connections x "
        f"{shape.streams} streams; {report.rounds} rounds of {shape.duration_s:g}s, unpinned"
    )
    if report.skipped:
        print(f"workers: not measured: {report.skipped}")
    if report.runs:
        print(render(report))
        print(LEGEND)
    for note in notes(report):
        print(f"  note: {note}")
    gain = report.speedup
    if gain.median is not None and gain.pooled is not None:
        print(
            f"workers: 2 workers give {gain.median:.2f}x the RPS of 1 (pooled {gain.pooled:.2f}x)"
        )
    print()
    print(render_costs(report.costs))
    print(metrics_summary(report))
    print(f"section time: {report.elapsed_s:.0f}s")


def _row_json(row: Row) -> dict[str, Any]:
    return {
        **asdict(row),
        "rps_per_sidecar_cpu_second": row.rps_per_sidecar_cpu,
        "sidecar_cpu_us_per_request": row.cpu_us_per_request,
    }


def _run_json(run: Run) -> dict[str, Any]:
    fields = {k: v for k, v in asdict(run).items() if k != "latencies_ms"}
    latency = asdict(summarize(run.latencies_ms))
    return {**fields, "round": run.round_no + 1, "rps": run.rps, "latency_ms": latency}


def write_results(path: Path, report: Report) -> Path:
    document = {
        "section": "workers",
        "issue": 5,
        "target": None,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": report.elapsed_s,
        "machine": report.machine,
        "pinning": "none: workers, load generator and driver share every CPU",
        "shape": asdict(report.shape),
        "rounds": report.rounds,
        "table": render(report) if report.runs else "",
        "rows": [_row_json(row) for row in report.rows.values()],
        "runs": [_run_json(run) for run in report.runs],
        "speedup": asdict(report.speedup),
        "hot_path_costs_us": {c.name: c.us_per_call for c in report.costs},
        "metrics_added_per_request_us": added_per_request(report.costs),
        "metrics_summary": metrics_summary(report),
        "notes": notes(report),
        "skipped": report.skipped,
    }
    return write_json(path.name, document, path.parent)

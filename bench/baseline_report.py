"""Issue #3's baseline section: verdicts, tables and the JSON document."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.baseline_outage import ANSWER_TIMEOUT_S, OutageRow, outage_verdict
from bench.latency import summarize
from bench.overhead_verdict import pooled
from bench.report import fmt, table, write_json
from bench.rls_load import Measurement

if TYPE_CHECKING:
    from bench.baseline import Bench

TARGET_RATIO = 2.0
REFERENCE = "empty"  # bench/empty_server.py, with the primary client only: the stack's ceiling


@dataclass(frozen=True, slots=True)
class Verdict:
    client: str
    ratio: float | None  # median over rounds of sidecar RPS / baseline RPS
    round_ratios: tuple[float, ...]
    ceiling: float | None  # the same for the empty handler: the most this stack allows
    p99_ms: tuple[float, float]  # sidecar, baseline (all rounds pooled)
    passed: bool | None
    summary: str


def _round_ratios(
    runs: Sequence[tuple[int, Measurement]], client: str, server: str = "sidecar"
) -> tuple[float, ...]:
    """`server` RPS / baseline RPS, per round in which both were measured with `client`."""
    by_round: dict[int, dict[str, Measurement]] = {}
    for round_no, run in runs:
        if run.client == client:
            by_round.setdefault(round_no, {})[run.server] = run
    pairs = [(r.get(server), r.get("baseline")) for r in by_round.values()]
    return tuple(s.rps / b.rps for s, b in pairs if s is not None and b is not None and b.rps)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def judge(runs: Sequence[tuple[int, Measurement]], client: str, primary: bool) -> Verdict:
    found = {r.server: r for r in pooled(runs) if r.client == client}
    sidecar, base = found.get("sidecar"), found.get("baseline")
    if sidecar is None or base is None:
        return Verdict(client, None, (), None, (0.0, 0.0), None, "NOT MEASURED")
    ratios = _round_ratios(runs, client)
    ratio, ceiling = _median(ratios), _median(_round_ratios(runs, client, REFERENCE))
    p99 = (sidecar.latency.p99_ms, base.latency.p99_ms)
    passed = ratio is not None and ratio >= TARGET_RATIO and p99[0] < p99[1]
    if sidecar.errors or base.errors:
        passed = False
    word = "PASS" if passed else "FAIL"
    summary = (
        f"{word}{'' if primary else ' (cross-check)'}: sidecar/baseline RPS = "
        f"{fmt(ratio, 2)}x (median of {len(ratios)} rounds; target >= {TARGET_RATIO:g}x); "
        f"p99 {p99[0]:.2f} ms vs {p99[1]:.2f} ms (target: lower)"
    )
    if ceiling is not None:
        summary += f"; the empty handler reaches {ceiling:.2f}x (this stack's ceiling)"
    if sidecar.errors or base.errors:
        summary += f"; failed requests: sidecar {sidecar.errors}, baseline {base.errors}"
    return Verdict(client, ratio, ratios, ceiling, p99, passed if primary else None, summary)


HEADER = (
    "client",
    "server",
    "RPS",
    "p50 ms",
    "p99 ms",
    "server CPU %",
    "CPU µs/req",
    "other CPU % s/c",
    "errors",
    "vs baseline",
)


def phase1_table(runs: Sequence[tuple[int, Measurement]], judged: Sequence[Verdict]) -> str:
    ratios = {(v.client, "sidecar"): v.ratio for v in judged}
    ratios |= {(v.client, REFERENCE): v.ceiling for v in judged}
    cells = []
    for row in pooled(runs):
        other = f"{fmt(row.cpu.other_on_server_cpu_pct)}/{fmt(row.cpu.other_on_client_cpu_pct)}"
        ratio = ratios.get((row.client, row.server))
        per_request = row.cpu.server_pct / 100 * 1e6 / row.rps if row.rps else None
        cells.append(
            [
                row.client,
                row.server,
                fmt(row.rps),
                fmt(row.latency.p50_ms, 2),
                fmt(row.latency.p99_ms, 2),
                fmt(row.cpu.server_pct),
                fmt(per_request),
                other,
                str(row.errors),
                "" if ratio is None else f"{ratio:.2f}x",
            ]
        )
    return table(HEADER, cells)


OUTAGE_HEADER = ("Redis", "server", "first request", "OK/s", "errors/s", "p99 ms", "state")


def outage_table(rows: Sequence[OutageRow]) -> str:
    cells = []
    for row in rows:
        load = row.load
        ok = errors = p99 = None
        if load is not None:
            ok, errors = load.rps, load.errors / load.duration_s
            p99 = summarize(load.latencies_ms).p99_ms
        cells.append(
            [
                row.redis,
                row.server,
                row.first.describe(),
                fmt(ok),
                fmt(errors),
                fmt(p99, 2),
                row.behaviour,
            ]
        )
    return table(OUTAGE_HEADER, cells)


def _notes(runs: Sequence[tuple[int, Measurement]], outages: Sequence[OutageRow]) -> list[str]:
    notes = []
    for row in pooled(runs):
        if row.cpu.noisy:
            notes.append(f"{row.client}/{row.server}: other load on the server CPU")
        if row.errors:
            notes.append(f"{row.client}/{row.server}: {row.errors} failed: {row.first_error}")
        notes += [f"{row.client}/{row.server}: {n}" for n in row.notes]
    for out in outages:
        if out.first.detail:
            notes.append(f"Redis {out.redis}, {out.server}: {out.first.detail}")
        if out.load is not None and out.load.first_error:
            notes.append(f"Redis {out.redis}, {out.server} load: {out.load.first_error}")
    return notes


def _row_json(row: Measurement) -> dict[str, Any]:
    return {
        "client": row.client,
        "server": row.server,
        "rps": row.rps,
        "requests": row.requests,
        "errors": row.errors,
        "first_error": row.first_error,
        "duration_s": row.duration_s,
        "latency_ms": asdict(row.latency),
        "cpu": {**asdict(row.cpu), "noisy": row.cpu.noisy},
        "runs": row.runs,
        "notes": row.notes,
    }


def _outage_json(row: OutageRow) -> dict[str, Any]:
    return {
        "redis": row.redis,
        "server": row.server,
        "first_request": asdict(row.first),
        "load": None if row.load is None else _row_json(row.load),
        "answering": row.answering,
        "state": row.state(),
    }


@dataclass(frozen=True, slots=True)
class Results:
    judged: list[Verdict]
    outage: list[tuple[bool | None, str]]
    skipped: list[str]
    elapsed_s: float

    @property
    def met(self) -> bool | None:
        found = [v.passed for v in self.judged if v.passed is not None]
        found += [passed for passed, _ in self.outage if passed is not None]
        return all(found) if found else None


def results(bench: Bench, skipped: list[str], elapsed_s: float) -> Results:
    clients = list(dict.fromkeys(r.client for _, r in bench.runs))
    judged = [judge(bench.runs, c, primary=i == 0) for i, c in enumerate(clients)]
    outage = [outage_verdict(bench.outages, redis) for redis in ("hung", "down")]
    return Results(judged, outage, skipped, elapsed_s)


LEGEND = """\
Redis up: RPS and latencies pool every round; vs baseline = median over rounds of RPS / the
baseline's RPS (same client, same round); empty = an empty grpc.aio handler on the same stack
(primary client only): no server on this stack can beat its RPS. CPU µs/req = server CPU time
per request; other CPU % s/c = work by anything else on the server's / the load generators' CPU
(Redis runs on the latter). Redis hung = SIGSTOP, down = SIGKILL:
first request = one request on the idle server (deadline {timeout:g} s); OK/s, errors/s and p99
from a {outage:g} s node-http2 run (every gRPC status checked) started with the outage."""


def render(bench: Bench, res: Results) -> str:
    shape = bench.ctx.shape
    lines = [
        f"ShouldRateLimit hot-10, {shape.connections} connections x {shape.streams} streams "
        f"({shape.in_flight} in flight); Redis up: {bench.rounds} rounds of {shape.duration_s:g}s"
        f" per row; pinning: {bench.ctx.pinning.describe()}, Redis on the load generators' CPU",
        phase1_table(bench.runs, res.judged),
        "",
        outage_table(bench.outages),
        LEGEND.format(timeout=ANSWER_TIMEOUT_S, outage=bench.outage_shape.duration_s),
    ]
    lines += [f"  note: {n}" for n in _notes(bench.runs, bench.outages)]
    lines += [f"  not measured: {s}" for s in res.skipped]
    lines += [v.summary for v in res.judged] + [text for _, text in res.outage]
    lines.append(f"section time: {res.elapsed_s:.0f}s")
    return "\n".join(lines)


def write_results(
    path: Path, bench: Bench, res: Results, text: str, machine_info: dict[str, Any], *, name: str
) -> Path:
    document = {
        "section": name,
        "issue": 3,
        "target": (
            f"sidecar RPS >= {TARGET_RATIO:g}x the per-request-Redis baseline's and a lower p99;"
            " with Redis hung or down the sidecar answers OK while the baseline errors or stalls"
        ),
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": res.elapsed_s,
        "machine": machine_info,
        "pinning": {**asdict(bench.ctx.pinning), "description": bench.ctx.pinning.describe()},
        "shape": asdict(bench.ctx.shape),
        "outage_shape": asdict(bench.outage_shape),
        "report": text,
        "rows": [_row_json(r) for r in pooled(bench.runs)],
        "runs": [{"round": n + 1, **_row_json(r)} for n, r in bench.runs],
        "outages": [_outage_json(r) for r in bench.outages],
        "verdicts": [asdict(v) for v in res.judged],
        "outage_verdicts": [{"passed": p, "summary": s} for p, s in res.outage],
        "skipped": res.skipped,
        "met": res.met,
    }
    return write_json(path.name, document, path.parent)

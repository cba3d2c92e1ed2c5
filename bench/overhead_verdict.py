"""The overhead section's verdicts: sidecar RPS as a share of the empty handler's, per round.

Each round measures both servers back to back, so a round's ratio is little affected by slow
drift in the machine's speed; the verdict uses the median over rounds. When a server was not
CPU-bound (below SATURATED_PCT of its core) its RPS understates what it can do, and the ratio
of RPS per second of server CPU (a capacity estimate) decides instead. A workload whose runs
had other load on the server's CPU (a shared machine) is reported but not judged.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from bench.cpuwatch import NOISE_LIMIT_PCT
from bench.rls_load import Measurement, pool

TARGET_RATIO = 0.90
SATURATED_PCT = 95.0  # a server at least this busy is CPU-bound: its RPS is its capacity

Runs = Sequence[tuple[int, Measurement]]  # (round, run)


@dataclass(frozen=True, slots=True)
class Verdict:
    workload: str
    client: str
    primary: bool  # False: a cross-check, shown but not judged
    ratio: float | None  # median over rounds of sidecar RPS / empty RPS
    cpu_ratio: float | None  # median over rounds of the same per second of server CPU
    pooled_ratio: float | None  # every round pooled: sidecar RPS / empty RPS
    round_ratios: tuple[float, ...]
    saturated: bool  # both servers CPU-bound: the RPS ratio decides
    passed: bool | None  # None: not judged (cross-check, missing, invalid or noisy)
    summary: str

    @property
    def decisive(self) -> float | None:
        return self.ratio if self.saturated else self.cpu_ratio


def pooled(runs: Runs) -> list[Measurement]:
    """One row per (workload, client, server), in the order first measured."""
    groups: dict[tuple[str, str, str], list[Measurement]] = {}
    for _, run in runs:
        groups.setdefault((run.workload, run.client, run.server), []).append(run)
    return [pool(group) for group in groups.values()]


def _pairs(runs: Runs, workload: str, client: str) -> list[tuple[Measurement, Measurement]]:
    """(sidecar, empty) measured in the same round."""
    by_round: dict[int, dict[str, Measurement]] = {}
    for round_no, run in runs:
        if (run.workload, run.client) == (workload, client):
            by_round.setdefault(round_no, {})[run.server] = run
    found = [(r.get("sidecar"), r.get("empty")) for r in by_round.values()]
    return [(s, e) for s, e in found if s is not None and e is not None]


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _summary(verdict: Verdict, empty: Measurement, sidecar: Measurement) -> str:
    decisive = verdict.decisive
    word = "PASS" if decisive is not None and decisive >= TARGET_RATIO else "FAIL"
    noisy = empty.cpu.noisy or sidecar.cpu.noisy
    if noisy:
        word = f"INCONCLUSIVE (other load on the server CPU; would be {word})"
    rounds = verdict.round_ratios
    text = (
        f"{word}: sidecar/empty = {pct(decisive)} "
        f"({'RPS' if verdict.saturated else 'RPS per server CPU-second'}, median of "
        f"{len(rounds)} rounds; target {TARGET_RATIO:.0%}). Pooled: sidecar {sidecar.rps:,.0f}"
        f" / empty {empty.rps:,.0f} req/s = {pct(verdict.pooled_ratio)}"
    )
    if rounds:
        text += f"; RPS ratio per round {min(rounds):.1%} .. {max(rounds):.1%}"
    if not verdict.saturated:
        text += (
            f"; a server was below {SATURATED_PCT:.0f}% CPU, so the CPU-normalized ratio decides"
        )
    if noisy:
        text += f"; rerun on a quiet machine (other load above {NOISE_LIMIT_PCT:.0f}%: see notes)"
    return text


def judge(runs: Runs, rows: Sequence[Measurement], pair: tuple[str, str], primary: bool) -> Verdict:
    workload, client = pair
    blank = Verdict(workload, client, primary, None, None, None, (), False, None, "")
    found = {r.server: r for r in rows if (r.workload, r.client) == pair}
    empty, sidecar = found.get("empty"), found.get("sidecar")
    if empty is None or sidecar is None:
        if empty is None and sidecar is None:
            return replace(blank, summary="NOT MEASURED (see above)")
        missing = "empty" if empty is None else "sidecar"
        return replace(blank, summary=f"NOT MEASURED (no {missing} server run)")
    pairs = _pairs(runs, workload, client)
    rps_ratios = tuple(s.rps / e.rps for s, e in pairs if e.rps)
    cpu_ratios = [_div(s.requests_per_cpu_second, e.requests_per_cpu_second) for s, e in pairs]
    saturated = min(empty.cpu.server_pct, sidecar.cpu.server_pct) >= SATURATED_PCT
    verdict = replace(
        blank,
        ratio=_median(rps_ratios),
        cpu_ratio=_median(cpu_ratios),
        pooled_ratio=_div(sidecar.rps, empty.rps),
        round_ratios=rps_ratios,
        saturated=saturated,
    )
    if empty.errors or sidecar.errors or not empty.requests or not sidecar.requests:
        return replace(verdict, summary="INVALID: failed requests (see notes)")
    decisive = verdict.decisive
    passed = decisive is not None and decisive >= TARGET_RATIO
    judged = primary and not (empty.cpu.noisy or sidecar.cpu.noisy)
    summary = _summary(verdict, empty, sidecar)
    return replace(verdict, passed=passed if judged else None, summary=summary)


def verdicts(runs: Runs, primary: Mapping[str, str]) -> list[Verdict]:
    """One verdict per (workload, client) measured, plus any primary pair that was not."""
    rows = pooled(runs)
    pairs = dict.fromkeys((r.workload, r.client) for r in rows)
    for workload, client in primary.items():
        pairs.setdefault((workload, client), None)
    return [judge(runs, rows, pair, primary.get(pair[0]) == pair[1]) for pair in pairs]

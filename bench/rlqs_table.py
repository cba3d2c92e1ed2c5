"""`bench rlqs`'s numbers (pure: samples in, rows and text out).

All stacks share one pinned core, so a stack's RPS is its share of it; `per_core` (RPS over the
core share its Envoy and service used) is its capacity on a core of its own. Ratios are per
round, then the median with the range.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.report import fmt, pct, table

PLAIN, ALLOW_ALL, RLQS, RLS = "plain", "rlqs-allow-all", "rlqs-sidecar", "rls-sidecar"
STACKS = (PLAIN, ALLOW_ALL, RLQS, RLS)
ABOUT = {
    PLAIN: "(a) Envoy, no rate limit filter",
    ALLOW_ALL: "(b) Envoy + rate_limit_quota, a server answering ALLOW_ALL: the ceiling",
    RLQS: "(c) Envoy + rate_limit_quota, the sidecar's real assignments",
    RLS: "(d) Envoy + ratelimit filter, ShouldRateLimit to the sidecar per request",
}
# (stack, baseline): the comparisons reported; the first is judged against TARGET.
COMPARISONS = ((RLQS, ALLOW_ALL), (RLQS, PLAIN), (ALLOW_ALL, PLAIN), (RLS, PLAIN))
TARGET = 0.95


@dataclass(frozen=True, slots=True)
class Sample:
    """One stack in one round. CPU as fractions of one core over the sampled window."""

    stack: str
    round_no: int
    requests: int
    seconds: float
    envoy_cpu: float
    service_cpu: float
    errors: int = 0
    first_error: str = ""
    other_cpu: float = 0.0  # work on the stacks' core by anything but the stacks

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def per_core(self) -> float | None:
        """Requests per second of the stack's own CPU (Envoy and its service together)."""
        used = self.envoy_cpu + self.service_cpu
        return self.rps / used if used > 0 else None


@dataclass(frozen=True, slots=True)
class Row:
    """A stack over every round: totals, and CPU per request."""

    stack: str
    rounds: int
    requests: int
    rps: float
    per_core: float | None
    envoy_us: float | None  # Envoy CPU µs per request
    service_ms_per_1000: float | None  # the rate limit service's CPU ms per 1,000 requests
    errors: int


def valid(samples: Sequence[Sample]) -> list[Sample]:
    """Samples whose load generator saw every request answered (the others are reported as
    problems, and left out of every row and ratio)."""
    return [x for x in samples if not x.errors and x.requests > 0]


def pooled(samples: Sequence[Sample]) -> list[Row]:
    """One row per stack, in STACKS order, from the rounds it was measured in validly."""
    samples, rows = valid(samples), []
    for stack in [s for s in STACKS if any(x.stack == s for x in samples)]:
        mine = [x for x in samples if x.stack == stack]
        seconds = sum(x.seconds for x in mine)
        requests = sum(x.requests for x in mine)
        envoy_s = sum(x.envoy_cpu * x.seconds for x in mine)
        service_s = sum(x.service_cpu * x.seconds for x in mine)
        rps = requests / seconds if seconds else 0.0
        rows.append(
            Row(
                stack=stack,
                rounds=len(mine),
                requests=requests,
                rps=rps,
                per_core=requests / (envoy_s + service_s) if envoy_s + service_s else None,
                envoy_us=envoy_s / requests * 1e6 if requests else None,
                service_ms_per_1000=service_s / requests * 1e6 if requests else None,
                errors=sum(x.errors for x in mine),
            )
        )
    return rows


Value = Callable[[Sample], float | None]


def ratios(samples: Sequence[Sample], stack: str, baseline: str, value: Value) -> list[float]:
    """`stack`'s value over `baseline`'s, in every round that measured both."""
    by_round: dict[int, dict[str, Sample]] = {}
    for x in valid(samples):
        by_round.setdefault(x.round_no, {})[x.stack] = x
    found = []
    for got in by_round.values():
        if stack in got and baseline in got:
            a, b = value(got[stack]), value(got[baseline])
            if a is not None and b:
                found.append(a / b)
    return found


@dataclass(frozen=True, slots=True)
class Ratio:
    stack: str
    baseline: str
    median: float | None
    low: float | None
    high: float | None

    def text(self) -> str:
        if self.median is None:
            return "-"
        return f"{pct(self.median)} ({pct(self.low)}–{pct(self.high)})"


def ratio(samples: Sequence[Sample], stack: str, baseline: str, value: Value) -> Ratio:
    found = ratios(samples, stack, baseline, value)
    if not found:
        return Ratio(stack, baseline, None, None, None)
    return Ratio(stack, baseline, statistics.median(found), min(found), max(found))


def per_core(x: Sample) -> float | None:
    return x.per_core


def rps(x: Sample) -> float | None:
    return x.rps


def verdict(samples: Sequence[Sample]) -> tuple[bool | None, str]:
    """The target: (c) serves at least TARGET of (b) per core (median over rounds)."""
    found = ratio(samples, RLQS, ALLOW_ALL, per_core)
    if found.median is None:
        return None, "rlqs-sidecar vs rlqs-allow-all: NOT MEASURED"
    passed = found.median >= TARGET
    word = "PASS" if passed else "FAIL"
    return passed, (
        f"rlqs-sidecar vs rlqs-allow-all: {word}: {found.text()} of the ceiling per core "
        f"(median and range over {len(ratios(samples, RLQS, ALLOW_ALL, per_core))} rounds); "
        f"target ≥ {TARGET:.0%}"
    )


def render(samples: Sequence[Sample]) -> list[str]:
    """The pooled table, then every comparison by capacity (per core) and by raw RPS."""
    header = ("stack", "rounds", "RPS", "RPS per core", "Envoy µs/req", "service ms/1k req")
    body = [
        [
            row.stack,
            str(row.rounds),
            fmt(row.rps),
            fmt(row.per_core),
            fmt(row.envoy_us, 1),
            fmt(row.service_ms_per_1000, 2),
        ]
        for row in pooled(samples)
    ]
    lines = [table(header, body, left=1), ""]
    compare = [
        [
            f"{stack} / {baseline}",
            ratio(samples, stack, baseline, per_core).text(),
            ratio(samples, stack, baseline, rps).text(),
        ]
        for stack, baseline in COMPARISONS
    ]
    lines.append(
        table(("ratio", "per core: median (range)", "raw RPS: median (range)"), compare, 1)
    )
    return lines

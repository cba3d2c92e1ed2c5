"""The named scenarios: each turns `SimParams` into a concrete `Setup` (what the engine runs).

A scenario only chooses defaults; every flag the user gives overrides them, so a scenario can
be combined with any other disturbance (e.g. `--scenario skewed --latency-ms 100`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from random import Random

from ratelimit_sidecar.config.model import Rule
from simulator.params import SimParams, rule_for
from simulator.traffic import (
    Boundary,
    Bursty,
    Change,
    Membership,
    RateSchedule,
    Steady,
    Surge,
)

T0_MS = 1_700_000_000_000  # an arbitrary epoch; the run starts at the next window boundary
BOOT_LEAD_MS = 2_000  # initial nodes start before traffic, so heartbeats have registered
BURST_FRACTION = 0.5
BOUNDARY_FRACTION = 0.9
SURGE_QUIET = 0.3  # the surge scenario's load before it (of MAX per window)

ScheduleFactory = Callable[[Random], RateSchedule]


@dataclass(frozen=True)
class Defaults:
    """What a scenario sets unless a flag says otherwise."""

    load: float
    about: str
    bursty: bool = False
    boundary: bool = False  # bursts across every other window boundary (traffic.Boundary)
    weights: tuple[float, ...] | None = None
    skew_ms: int = 0
    latency_ms: int = 0
    outage: tuple[float, float] | None = None  # fractions of the run
    churn: bool = False
    rlqs_outage: tuple[float, float] | None = None  # fractions: the RLQS server unreachable
    surge: bool = False  # at SURGE_QUIET of the load until half the run, then the load


SCENARIOS: dict[str, Defaults] = {
    "steady": Defaults(2.0, "steady over-limit load (2x), even split"),
    "steady_under": Defaults(0.8, "steady under-limit load (0.8x), even split"),
    "boundary": Defaults(
        2.0, "over-limit (2x), 90% in one-span bursts across every other window end", boundary=True
    ),
    "near_limit": Defaults(0.95, "near the limit (0.95x), even split: some windows cross"),
    "bursty": Defaults(
        0.6, "under-limit bursty: 0.6x on average, half of it in one-span bursts", bursty=True
    ),
    "skewed": Defaults(2.0, "over-limit (2x), load balancer 60/30/10", weights=(6, 3, 1)),
    "skewed_under": Defaults(0.9, "under-limit (0.9x), load balancer 60/30/10", weights=(6, 3, 1)),
    "churn": Defaults(2.0, "over-limit (2x); +N/2 nodes join at 1/3, N/2 leave at 2/3", churn=True),
    "surge": Defaults(2.0, "0.3x until half the run, then over-limit (2x) at once", surge=True),
    "outage": Defaults(
        2.0, "over-limit (2x); the store is down from 1/3 to 1/2", outage=(1 / 3, 1 / 2)
    ),
    "skew": Defaults(2.0, "over-limit (2x); node clocks spread over +-500 ms", skew_ms=500),
    "latency": Defaults(2.0, "over-limit (2x); the store answers after 200 ms", latency_ms=200),
    "rlqs_outage": Defaults(
        2.0,
        "over-limit (2x); RLQS gateways cannot reach their server from 1/3 to 1/2",
        rlqs_outage=(1 / 3, 1 / 2),
    ),
}


@dataclass(frozen=True)
class Setup:
    """A fully resolved run: what every system in the comparison is given."""

    name: str
    params: SimParams
    rule: Rule
    rate_per_s: float
    schedule: ScheduleFactory
    membership: Membership
    offsets: tuple[int, ...]  # per node: node clock minus true clock
    outages: tuple[tuple[int, int], ...]  # true ms, store down in [start, end)
    rlqs_outages: tuple[tuple[int, int], ...]  # true ms, RLQS server unreachable
    latency_ms: int
    node_ttl_ms: int
    start_ms: int
    end_ms: int

    @property
    def boot_ms(self) -> int:
        return self.start_ms - BOOT_LEAD_MS

    @property
    def slack_ms(self) -> int:
        """Detection allowance after a crossing: a span, a round trip, the clock spread."""
        spread = max(self.offsets) - min(self.offsets)
        return self.params.span_ms + self.latency_ms + spread


def resolve(params: SimParams) -> Setup:
    """Apply the scenario's defaults under the user's flags."""
    if params.scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {params.scenario!r}; known: {', '.join(SCENARIOS)}")
    d = SCENARIOS[params.scenario]
    weights = params.weights or d.weights
    if weights is not None:
        params = replace(params, nodes=len(weights))
    start = (T0_MS // params.window_ms + 1) * params.window_ms
    end = start + params.windows * params.window_ms
    membership = _membership(params, weights, d.churn, start, end)
    rate = params.rate if params.rate is not None else params.per_second(params.load or d.load)
    skew = d.skew_ms if params.skew_ms is None else params.skew_ms
    return Setup(
        name=params.scenario,
        params=params,
        rule=rule_for(params),
        rate_per_s=rate,
        schedule=_schedule(params, rate, d, start),
        membership=membership,
        offsets=_offsets(len(membership.weights), skew),
        outages=_outages(params.outage, d.outage, params, start),
        rlqs_outages=_outages(params.rlqs_outage, d.rlqs_outage, params, start),
        latency_ms=d.latency_ms if params.latency_ms is None else params.latency_ms,
        node_ttl_ms=_node_ttl(params),
        start_ms=start,
        end_ms=end,
    )


def _membership(
    p: SimParams, weights: tuple[float, ...] | None, churn: bool, start: int, end: int
) -> Membership:
    if not churn:
        return Membership(weights or (1.0,) * p.nodes, p.nodes, ())
    extra = max(1, p.nodes // 2)
    join_at, leave_at = start + (end - start) // 3, start + 2 * (end - start) // 3
    joins = [Change(join_at, p.nodes + i, True) for i in range(extra)]
    leaves = [Change(leave_at, i, False) for i in range(min(extra, p.nodes))]
    return Membership((1.0,) * (p.nodes + extra), p.nodes, tuple(joins + leaves))


def _schedule(p: SimParams, rate_per_s: float, d: Defaults, start: int) -> ScheduleFactory:
    per_ms = rate_per_s / 1000
    if d.boundary:
        return lambda _rng: Boundary(per_ms, p.window_ms, p.span_ms, BOUNDARY_FRACTION, start)
    if d.surge:
        at = start + p.windows // 2 * p.window_ms
        return lambda _rng: Surge(per_ms, per_ms * SURGE_QUIET / (p.load or d.load), at)
    if not d.bursty:
        return lambda _rng: Steady(per_ms)
    return lambda rng: Bursty(per_ms, p.window_ms, p.span_ms, BURST_FRACTION, start, rng)


def _offsets(count: int, skew_ms: int) -> tuple[int, ...]:
    """Spread evenly over [-skew, +skew], so the clock spread is exactly 2 x skew."""
    if count == 1 or skew_ms == 0:
        return (0,) * count
    return tuple(round(-skew_ms + 2 * skew_ms * i / (count - 1)) for i in range(count))


def _outages(
    given: tuple[int, int] | None, default: tuple[float, float] | None, p: SimParams, start: int
) -> tuple[tuple[int, int], ...]:
    if given is not None:
        return ((start + given[0], start + given[1]),)
    if default is None:
        return ()
    a, b = default
    window = p.window_ms
    # Whole windows, so the fallback's per-window bound is measured on clean windows.
    return ((start + round(a * p.windows) * window, start + round(b * p.windows) * window),)


def _node_ttl(p: SimParams) -> int:
    """Heartbeat TTL: three span syncs (or idle polls) missed means the node is gone."""
    if p.node_ttl_ms is not None:
        return p.node_ttl_ms
    return 3 * max(p.span_ms, 1000)

"""What one simulation run is about: the rule under test, the fleet, the load, how long.

Fields left at None take the scenario's default (see `scenarios.py`), so a flag such as
`--skew-ms` can add clock skew to any scenario while each scenario still stands alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ratelimit_sidecar.config.model import AlgorithmName, Penalty, RateLimit, Rule, Unit

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_SCALE_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, None: 1000}


def parse_duration_ms(text: str) -> int:
    """`10`, `10s`, `1.5s` -> seconds; `500ms` -> milliseconds; `2m`, `1h` as usual."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"not a duration: {text!r} (try 10s, 500ms, 2m)")
    value = float(match.group(1)) * _SCALE_MS[match.group(2)]
    if value != int(value):
        raise ValueError(f"duration {text!r} is not a whole number of milliseconds")
    return int(value)


@dataclass(frozen=True)
class SimParams:
    """Everything the command line can set. Times are milliseconds."""

    scenario: str = "steady"
    nodes: int = 4
    max: int = 240
    window_ms: int = 10_000
    spans: int = 6
    cooldown_ms: int = 0  # 0: one window, the config's default
    windows: int = 100
    seed: int = 1
    rate: float | None = None  # total offered requests per second
    load: float | None = None  # offered / limit; used when `rate` is None
    skew_ms: int | None = None  # node clocks spread evenly over [-skew, +skew]
    latency_ms: int | None = None  # store round trip
    outage: tuple[int, int] | None = None  # ms after the start: store down in [start, end)
    weights: tuple[float, ...] | None = None  # load balancer shares per node
    timeout_ms: int = 250  # the sync loop's store timeout (serve --sync-timeout-ms)
    node_ttl_ms: int | None = None  # heartbeat TTL for live_nodes; 0 turns heartbeats off
    algorithm: AlgorithmName = AlgorithmName.FIXED_WINDOW
    burst: int = 0  # a token bucket's capacity; 0: one window's worth (MAX)
    rlqs_gateways: int | None = None  # RLQS systems: this many gateways (the first) on RLQS
    rlqs_outage: tuple[int, int] | None = None  # ms after the start: RLQS server unreachable
    penalty: Penalty | None = None  # progressive penalties on the rule (core/penalty.py)

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.max < 1 or self.windows < 1:
            raise ValueError("nodes, max and windows must be at least 1")
        if self.spans < 2:
            raise ValueError("spans must be at least 2")
        if self.window_ms < self.spans * 50:
            raise ValueError("the window must be at least spans x 50 ms, as in the config")
        if self.burst < 0:
            raise ValueError("burst must be at least 0")

    @property
    def span_ms(self) -> int:
        return self.window_ms // self.spans

    @property
    def cooldown(self) -> int:
        """As the config derives it: a fixed window blocks one window by default, the other
        algorithms only when a cooldown is set."""
        fixed = self.algorithm is AlgorithmName.FIXED_WINDOW
        return self.cooldown_ms or (self.window_ms if fixed else 0)

    def per_second(self, load: float) -> float:
        """Requests per second that offer `load` times the limit."""
        return load * self.max * 1000 / self.window_ms


def build_rule(  # noqa: PLR0917 - mirrors the limit's own fields, each named at call sites
    max_: int,
    window_ms: int,
    spans: int,
    cooldown_ms: int,
    algorithm: AlgorithmName = AlgorithmName.FIXED_WINDOW,
    burst: int = 0,
    *,
    penalty: Penalty | None = None,
) -> Rule:
    """The one rule every simulated request hits, built as the config loader would; a window
    that is not a whole number of seconds (rules cannot say that) is given exactly."""
    whole = window_ms % 1000 == 0
    limit = RateLimit(
        max_,
        Unit.SECOND,
        window_ms // 1000 if whole else 1,
        "sim",
        spans,
        cooldown_ms,
        algorithm=algorithm,
        burst=burst,
        penalty=penalty,
        exact_window_ms=0 if whole else window_ms,
    )
    return Rule("sim", (("client", ""),), limit)


def rule_for(p: SimParams, share: int = 1) -> Rule:
    """The run's rule; with `share` > 1, one node's 1/share of it (local-only mode): MAX and
    a set burst divided, at least 1 each. Only a token bucket has a burst (as in rule files),
    so that `--algorithm all --burst N` gives the other algorithms their usual rule."""
    max_ = max(1, p.max // share)
    bucket = p.algorithm is AlgorithmName.TOKEN_BUCKET
    burst = max(1, p.burst // share) if p.burst and bucket else 0
    return build_rule(
        max_, p.window_ms, p.spans, p.cooldown_ms, p.algorithm, burst, penalty=p.penalty
    )


def parse_penalty(text: str) -> Penalty:
    """`FACTOR,MAX,FORGIVE_AFTER`, e.g. `2,80s,60s`: as a rule's `penalty:` mapping."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 3:
        raise ValueError(f"penalty {text!r}: expected FACTOR,MAX,FORGIVE_AFTER, e.g. 2,80s,60s")
    factor = float(parts[0])
    if factor < 1:
        raise ValueError(f"penalty {text!r}: the factor must be at least 1")
    return Penalty(factor, parse_duration_ms(parts[1]), parse_duration_ms(parts[2]))


def penalty_text(penalty: Penalty | None) -> str:
    if penalty is None:
        return "off"
    most, forgive = penalty.max_ms / 1000, penalty.forgive_after_ms / 1000
    return f"x{penalty.factor:g} max {most:g}s forgive {forgive:g}s"


@dataclass(frozen=True)
class StormParams:
    """The `retry_storm` scenario's clients (simulate/storm.py): who they are and how they
    behave on a 429."""

    obedient: int = 16
    hammering: int = 4
    client_load: float = 1.5  # each client's fresh requests over its key's limit
    hammer_gap_ms: int = 20  # a hammering client's pause between retries
    hammer_tries: int = 100  # retries of one request before a hammering client drops it
    obedient_tries: int = 10  # the same for an obedient client (each after its Retry-After)

    def __post_init__(self) -> None:
        if self.obedient < 0 or self.hammering < 0 or self.obedient + self.hammering < 1:
            raise ValueError("retry_storm needs at least one client")
        if self.client_load <= 0 or self.hammer_gap_ms < 1:
            raise ValueError("client load must be > 0 and the hammer gap at least 1 ms")

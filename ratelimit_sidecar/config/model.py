"""Parsed rule configuration: frozen objects built once by the loader, read on every request. The
shape follows `envoyproxy/ratelimit`'s YAML: a domain holds a tree of descriptor nodes.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


class Unit(enum.IntEnum):
    """The numbers are Envoy's `RateLimitResponse.RateLimit.Unit`."""

    UNKNOWN = 0
    SECOND = 1
    MINUTE = 2
    HOUR = 3
    DAY = 4
    MONTH = 5
    YEAR = 6
    WEEK = 7

    @property
    def seconds(self) -> int:
        return _UNIT_SECONDS[self]


# By number; fixed month and year lengths, as in the reference: windows align on epoch multiples.
_UNIT_SECONDS = (0, 1, 60, 3600, 86400, 30 * 86400, 365 * 86400, 7 * 86400)


class AlgorithmName(enum.IntEnum):
    """An int enum: the limiter indexes its algorithms by it per request."""

    FIXED_WINDOW = 0
    SLIDING_WINDOW = 1
    TOKEN_BUCKET = 2
    SLIDING_LOG = 3

    @property
    def text(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> AlgorithmName | None:
        return cls.__members__.get(text.strip().upper())


class StoreFailure(enum.Enum):
    """What a strict rule does when the store cannot answer."""

    LOCAL = "local"  # decide from this node's memory, as an eventual rule would
    ALLOW = "allow"
    DENY = "deny"


class Consistency(enum.Enum):
    """How a limit's counts are shared: `eventual` decides every request from memory; `edge`
    does too, but syncs a key fast while the fleet could reach its limit before the next span
    sync (core/edge.py); `strict` checks every request on the store."""

    EVENTUAL = "eventual"
    EDGE = "edge"
    STRICT = "strict"


DEFAULT_SPANS = 6
NEAR_LIMIT_RATIO = 0.8  # the reference's NEAR_LIMIT_RATIO default
MIN_SPAN_MS = 50


@dataclass(frozen=True, slots=True)
class RuleDefaults:
    """What a rule file leaves unsaid, set by the operator's flags."""

    algorithm: AlgorithmName = AlgorithmName.FIXED_WINDOW
    spans: int = DEFAULT_SPANS
    near_limit_ratio: float = NEAR_LIMIT_RATIO
    consistency: Consistency = Consistency.EDGE  # of a limit that names none
    # With a store, rules exact only on one node (an eventual sliding log) are refused.
    shared_store: bool = False


DEFAULT_RULES = RuleDefaults()


@dataclass(frozen=True, slots=True)
class Source:
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class Penalty:
    """`penalty:` of a limit with a block (core/penalty.py)."""

    factor: float
    max_ms: int
    forgive_after_ms: int


@dataclass(frozen=True, slots=True)
class RateLimit:
    """`requests_per_unit` per window of `unit * unit_multiplier`; `burst` is a token bucket's
    capacity (0: one window's worth); a `strict` limit is checked on the store per request."""

    requests_per_unit: int
    unit: Unit
    unit_multiplier: int = 1
    name: str = ""
    spans: int = DEFAULT_SPANS
    cooldown_ms: int = 0  # 0: the algorithm's default (one window for a fixed window)
    # `cooldown: window_end`: a block ends with its window, as in the reference.
    cooldown_window_end: bool = False
    replaces: tuple[str, ...] = ()
    algorithm: AlgorithmName = AlgorithmName.FIXED_WINDOW
    burst: int = 0
    strict: bool = False
    edge: bool = False  # `consistency: edge` (core/edge.py)
    # The hits of a refused request count too, as the reference counts them: costs reported
    # after the response (Envoy's `apply_on_stream_done`) are spent whatever the answer.
    count_refused: bool = False
    on_store_failure: StoreFailure = StoreFailure.LOCAL
    penalty: Penalty | None = None  # longer blocks for clients ignoring Retry-After
    # Share of the limit from which an admitted answer says `near_limit` (a metric).
    near_limit_ratio: float = field(default=NEAR_LIMIT_RATIO, compare=False)
    # A window of this many ms instead of `unit` x `unit_multiplier` (0: those). Rules say whole
    # units; the accuracy simulator tries windows of any length (simulator/params.py).
    exact_window_ms: int = 0
    # Derived once: the request path reads these for every hit.
    window_ms: int = field(init=False, compare=False, repr=False)
    # ms a key crossing the limit stays blocked: a fixed window's default is one window; 0 (the
    # others' default) refuses until the request fits. 0 with `cooldown_window_end` too: the
    # length depends on the start, and no shared flag may outlive the window.
    cooldown: int = field(init=False, compare=False, repr=False)
    capacity: int = field(init=False, compare=False, repr=False)  # burst or requests_per_unit
    # `algorithm` as an int: it indexes the limiter's algorithms on every decision, which an
    # IntEnum would make a generic call (docs/PERFORMANCE.md).
    algorithm_index: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        window = self.exact_window_ms or self.unit.seconds * self.unit_multiplier * 1000
        object.__setattr__(self, "window_ms", window)
        fixed = self.algorithm is AlgorithmName.FIXED_WINDOW
        cooldown = 0 if self.cooldown_window_end else self.cooldown_ms or (window if fixed else 0)
        object.__setattr__(self, "cooldown", cooldown)
        object.__setattr__(self, "capacity", self.burst or self.requests_per_unit)
        object.__setattr__(self, "algorithm_index", int(self.algorithm))

    @property
    def window_seconds(self) -> int:
        return self.unit.seconds * self.unit_multiplier


@dataclass(frozen=True, slots=True, eq=False)
class Rule:
    """`limit` is the first of `limits` (None: none, or `unlimited`). Rules compare by identity;
    reloads of the same YAML give equal `id`s, which keeps counters across a reload."""

    domain: str
    path: tuple[tuple[str, str], ...]  # (key, value) from the root; value "" for a value-less key
    limit: RateLimit | None = None
    unlimited: bool = False
    shadow_mode: bool = False
    detailed_metric: bool = False
    source: Source | None = None
    # Here too, not only in `limit.replaces`: an `unlimited` rule (no `limit`) may replace.
    replaces: tuple[str, ...] = ()
    value_to_metric: bool = False  # this node's own `value_to_metric` flag
    limits: tuple[RateLimit, ...] = ()
    # Refuses only if every quota descriptor of the request is over too (service/overall.py).
    quota_mode: bool = False
    # Returned in the dynamic metadata when the descriptor passes (--response-dynamic-metadata).
    metadata: Mapping[str, object] | None = None
    # Levels of `path` marked `share_threshold`: all values share one counter, named by the pattern.
    shared_levels: tuple[int, ...] = ()
    # Levels marked `value_to_metric` (not `share_threshold`): labels show the request's value.
    valued_levels: tuple[int, ...] = ()
    # `domain.key_value.key2`, derived once: metrics label every decision with it.
    id: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        parts = [f"{k}_{v}" if v else k for k, v in self.path]
        object.__setattr__(self, "id", ".".join([self.domain, *parts]))
        if self.limit is not None and not self.limits:
            object.__setattr__(self, "limits", (self.limit,))
        elif self.limits and self.limit is None:
            object.__setattr__(self, "limit", self.limits[0])


@dataclass(frozen=True, slots=True)
class WildcardChild:
    """A child whose value contains `*`; matched in file order after exact values."""

    key: str
    pattern: re.Pattern[str]
    node: DescriptorNode


@dataclass(frozen=True, slots=True)
class DescriptorNode:
    rule: Rule
    exact: Mapping[tuple[str, str], DescriptorNode] = field(
        default_factory=lambda: MappingProxyType({})
    )
    wildcards: tuple[WildcardChild, ...] = ()
    keyed: Mapping[str, DescriptorNode] = field(default_factory=lambda: MappingProxyType({}))

    def child(self, key: str, value: str) -> DescriptorNode | None:
        node = self.exact.get((key, value))
        if node is not None:
            return node
        for wildcard in self.wildcards:
            if wildcard.key == key and wildcard.pattern.fullmatch(value):
                return wildcard.node
        return self.keyed.get(key)


@dataclass(frozen=True, slots=True)
class Domain:
    name: str
    root: DescriptorNode
    source: Source

    def rules(self) -> list[Rule]:
        """Depth first in file order."""
        found: list[Rule] = []
        _collect(self.root, found)
        return found


def _collect(node: DescriptorNode, out: list[Rule]) -> None:
    children = [*node.exact.values(), *(w.node for w in node.wildcards), *node.keyed.values()]
    for child in children:
        out.append(child.rule)
        _collect(child, out)


@dataclass(frozen=True, slots=True)
class RuleSet:
    domains: Mapping[str, Domain]
    version: str = ""
    # Some rule has `quota_mode`; derived at load, so swapping rules in walks no tree.
    has_quota_mode: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        rules = (rule for domain in self.domains.values() for rule in domain.rules())
        object.__setattr__(self, "has_quota_mode", any(rule.quota_mode for rule in rules))

    def domain(self, name: str) -> Domain | None:
        return self.domains.get(name)


def wildcard_pattern(value: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in value.split("*")), re.DOTALL)

"""Parsed rule configuration: frozen objects built once by the loader, read on every request.

The shape follows the YAML of `envoyproxy/ratelimit`: a domain holds a tree of descriptor nodes,
each node matches one request entry (`key` and optionally `value`) and may carry a rate limit.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


class Unit(enum.IntEnum):
    """Time units; the numbers are those of Envoy's `RateLimitResponse.RateLimit.Unit`."""

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


# Month and year have fixed lengths, as in the reference service, so windows align on epoch
# multiples.
_UNIT_SECONDS = {
    Unit.UNKNOWN: 0,
    Unit.SECOND: 1,
    Unit.MINUTE: 60,
    Unit.HOUR: 3600,
    Unit.DAY: 86400,
    Unit.WEEK: 7 * 86400,
    Unit.MONTH: 30 * 86400,
    Unit.YEAR: 365 * 86400,
}


class AlgorithmName(enum.IntEnum):
    """How a limit counts. An int enum: the limiter indexes its algorithms by it per request."""

    FIXED_WINDOW = 0
    SLIDING_WINDOW = 1
    TOKEN_BUCKET = 2
    SLIDING_LOG = 3

    @property
    def text(self) -> str:
        """The name rule files and flags use: `fixed_window`, `token_bucket`, ..."""
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> AlgorithmName | None:
        return cls.__members__.get(text.strip().upper())


class StoreFailure(enum.Enum):
    """What a strict rule does when the shared store cannot answer its check."""

    LOCAL = "local"  # decide from this node's memory, as an eventual rule would
    ALLOW = "allow"
    DENY = "deny"


DEFAULT_SPANS = 6
NEAR_LIMIT_RATIO = 0.8  # the reference's NEAR_LIMIT_RATIO default
MIN_SPAN_MS = 50


@dataclass(frozen=True, slots=True)
class RuleDefaults:
    """What a rule file leaves unsaid, set by the operator's flags."""

    algorithm: AlgorithmName = AlgorithmName.FIXED_WINDOW
    spans: int = DEFAULT_SPANS
    near_limit_ratio: float = NEAR_LIMIT_RATIO
    # Counts are shared through a store (a Redis URL is set): rules that can only be exact on
    # one node (an eventual sliding log) are refused.
    shared_store: bool = False


DEFAULT_RULES = RuleDefaults()


@dataclass(frozen=True, slots=True)
class Source:
    """Where a piece of configuration came from, for error messages and /debug/rules."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class Penalty:
    """`penalty:` of a limit with a block: a client that sends again while its key is blocked,
    before the Retry-After it was told, makes the key's next block `factor` times longer, up to
    `max_ms`; the level goes back to 0 after `forgive_after_ms` without offence. The rule:
    core/penalty.py."""

    factor: float
    max_ms: int
    forgive_after_ms: int


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A counted limit: `requests_per_unit` per window of `unit * unit_multiplier`.

    `algorithm` says how the window is counted; `burst` is a token bucket's capacity (0: one
    window's worth). A `strict` limit is checked against the shared store on every request;
    `on_store_failure` says what it does when the store cannot answer.
    """

    requests_per_unit: int
    unit: Unit
    unit_multiplier: int = 1
    name: str = ""
    spans: int = DEFAULT_SPANS
    cooldown_ms: int = 0  # 0: the algorithm's default (one window for a fixed window)
    # `cooldown: window_end` (fixed window only): a block ends where its window ends, as in the
    # reference service, instead of lasting a cooldown into the next window.
    cooldown_window_end: bool = False
    replaces: tuple[str, ...] = ()
    algorithm: AlgorithmName = AlgorithmName.FIXED_WINDOW
    burst: int = 0
    strict: bool = False
    on_store_failure: StoreFailure = StoreFailure.LOCAL
    penalty: Penalty | None = None  # longer blocks for clients ignoring Retry-After
    # An admitted answer says `near_limit` (a metric) from this share of the limit used on.
    near_limit_ratio: float = field(default=NEAR_LIMIT_RATIO, compare=False)
    # Derived once: the request path reads these for every hit.
    window_ms: int = field(init=False, compare=False, repr=False)
    # ms a key crossing the limit stays blocked. A fixed window blocks for one window unless
    # told otherwise; the other algorithms block only when `cooldown` is set (0), otherwise a
    # refusal lasts until the request fits again. 0 with `cooldown_window_end`: the block's
    # length depends on when it starts, and no shared block flag may outlive the window.
    cooldown: int = field(init=False, compare=False, repr=False)
    capacity: int = field(init=False, compare=False, repr=False)  # burst or requests_per_unit

    def __post_init__(self) -> None:
        window = self.unit.seconds * self.unit_multiplier * 1000
        object.__setattr__(self, "window_ms", window)
        fixed = self.algorithm is AlgorithmName.FIXED_WINDOW
        cooldown = 0 if self.cooldown_window_end else self.cooldown_ms or (window if fixed else 0)
        object.__setattr__(self, "cooldown", cooldown)
        object.__setattr__(self, "capacity", self.burst or self.requests_per_unit)

    @property
    def window_seconds(self) -> int:
        return self.unit.seconds * self.unit_multiplier


@dataclass(frozen=True, slots=True, eq=False)
class Rule:
    """One descriptor node of the config tree and what a request that ends on it gets.

    `limit` is None when the node has no `rate_limit`, or when it is `unlimited`. `limits` holds
    every limit of the node: `(limit,)` for `rate_limit`, several for `rate_limits` (then `limit`
    is the first of them), () when `limit` is None.
    Rules compare by identity: two reloads of the same YAML give equal `id`s, which is what
    lets counters survive a reload.
    """

    domain: str
    path: tuple[tuple[str, str], ...]  # (key, value) from the root; value "" for a value-less key
    limit: RateLimit | None = None
    unlimited: bool = False
    shadow_mode: bool = False
    detailed_metric: bool = False
    source: Source | None = None
    # Names this node's `rate_limit` replaces. Kept here (not only in `limit.replaces`) because
    # the reference lets an `unlimited` rule, whose `limit` is None, replace other limits too.
    replaces: tuple[str, ...] = ()
    value_to_metric: bool = False  # this node's own `value_to_metric` flag
    limits: tuple[RateLimit, ...] = ()
    # `quota_mode`: over its limit, this descriptor refuses the request only if every quota
    # descriptor of the request is over too (the reference's quota mode, service/overall.py).
    quota_mode: bool = False
    # `metadata`: returned in the response's dynamic metadata when the descriptor passes
    # (with --response-dynamic-metadata); JSON-like values, read only.
    metadata: Mapping[str, object] | None = None
    # Indexes into `path` of wildcard levels marked `share_threshold` in the reference: every value
    # matching that wildcard shares one counter, named by the pattern instead of the request value.
    shared_levels: tuple[int, ...] = ()
    # Indexes into `path` of the levels (this node's or its ancestors') marked `value_to_metric`
    # and not `share_threshold`: the metric label shows the request's value there.
    valued_levels: tuple[int, ...] = ()
    # Stable name for metrics and debug output, `domain.key_value.key2`; derived once because
    # metrics label every decision with it.
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
    """A level of the tree: the rule reached here and the children for the next request entry."""

    rule: Rule
    exact: Mapping[tuple[str, str], DescriptorNode] = field(
        default_factory=lambda: MappingProxyType({})
    )
    wildcards: tuple[WildcardChild, ...] = ()
    keyed: Mapping[str, DescriptorNode] = field(default_factory=lambda: MappingProxyType({}))

    def child(self, key: str, value: str) -> DescriptorNode | None:
        """The node one request entry leads to: exact, then wildcard, then value-less key."""
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
        """Every rule of the tree, depth first in file order."""
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
    """All loaded domains; `version` changes whenever the content does."""

    domains: Mapping[str, Domain]
    version: str = ""
    # Some rule has `quota_mode`: a refused request may still be answered OK. Derived once,
    # where the rules are loaded, so that swapping them in costs no walk of the tree.
    has_quota_mode: bool = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        rules = (rule for domain in self.domains.values() for rule in domain.rules())
        object.__setattr__(self, "has_quota_mode", any(rule.quota_mode for rule in rules))

    def domain(self, name: str) -> Domain | None:
        return self.domains.get(name)


def wildcard_pattern(value: str) -> re.Pattern[str]:
    """Compile a config value where `*` stands for any run of characters."""
    return re.compile(".*".join(re.escape(part) for part in value.split("*")), re.DOTALL)

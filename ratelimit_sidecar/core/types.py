"""Values passed in and out of the limiter core. Plain data, no behaviour, no I/O."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from ratelimit_sidecar.config.model import RateLimit, Rule

# A counter's identity: (domain, key1, value1, key2, value2, ...) from the request entries.
KeyId = tuple[str, ...]


class Code(enum.IntEnum):
    """Same numbers as Envoy's `RateLimitResponse.Code`; the core never answers UNKNOWN."""

    OK = 1
    OVER_LIMIT = 2


# A NamedTuple: built for each descriptor of every request first seen (docs/PERFORMANCE.md).
class Hit(NamedTuple):
    rule: Rule | None  # None: no rule matched this descriptor
    key: KeyId
    hits: int


class Verdict:  # noqa: PLW1641 - compared (tests, property checks), never hashed
    """What one descriptor got; never changed once built (shared ones exist). `limit` None: none
    applies. `reset_ms`: until the block ends if blocked, else the window; `shadow_refused`: over,
    answered OK in shadow mode. A plain class: built for every decision (docs/PERFORMANCE.md)."""

    def __init__(  # noqa: PLR0917 - positional: the request path builds one per decision
        self, code: Code, limit: RateLimit | None = None, unlimited: bool = False,
        remaining: int = 0, reset_ms: int = 0, shadow_refused: bool = False, shadow: bool = False,
        near_limit: bool = False,
    ) -> None:  # fmt: skip
        self.code, self.limit, self.unlimited, self.remaining = code, limit, unlimited, remaining
        self.reset_ms, self.shadow_refused = reset_ms, shadow_refused
        self.shadow, self.near_limit = shadow, near_limit

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Verdict) and self._values() == other._values()

    def __repr__(self) -> str:
        return f"Verdict{self._values()}"

    def _values(self) -> tuple[object, ...]:
        return (self.code, self.limit, self.unlimited, self.remaining, self.reset_ms,
                self.shadow_refused, self.shadow, self.near_limit)  # fmt: skip


# The codes as constants: the request path compares with them on every decision, and reading a
# member off its enum class costs far more than a constant (docs/PERFORMANCE.md).
OK: Final = Code.OK
OVER_LIMIT: Final = Code.OVER_LIMIT


class Decision:  # noqa: PLW1641 - compared (tests), never hashed
    """The answer to one request: OVER_LIMIT if any descriptor is over (and not shadowed). A
    plain class, as Verdict."""

    def __init__(self, code: Code, verdicts: tuple[Verdict, ...]) -> None:
        self.code, self.verdicts = code, verdicts

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Decision)
            and self.code == other.code
            and self.verdicts == other.verdicts
        )

    def __repr__(self) -> str:
        return f"Decision({self.code!r}, {self.verdicts!r})"


class Push(NamedTuple):
    key: KeyId
    window: int
    hits: int
    limit: RateLimit
    span: int = -1  # the hits' span number from the epoch; -1: the last span of `window`
    wanted_level: int = 0  # a penalised client offended: the level asked for; 0: none
    blocking_level: int = -1  # the level of the node's own running block; -1: none
    announce: bool = False  # a key alone here: the store announces its total past NEAR_SHARE
    edge: bool = False  # a key at the edge: the store announces every push (core/edge.py)


@dataclass(frozen=True, slots=True)
class TotalRead:
    key: KeyId
    window: int


@dataclass(slots=True)
class SyncBatch:
    """One span end's round trip; the `SyncResult`'s lists line up with these."""

    now_ms: int
    pushes: list[Push] = field(default_factory=list)
    total_reads: list[TotalRead] = field(default_factory=list)
    heartbeat: bool = True  # register the node and count the live ones

    def __bool__(self) -> bool:
        return bool(self.pushes or self.total_reads)


class PushResult(NamedTuple):
    total: int  # the counter's value after the INCRBY
    block_ms: int  # remaining time of the shared block flag, 0 if none
    error: str = ""  # why nothing was applied ("": it was): surely not counted, may be resent
    spans: tuple[int, ...] = ()  # a sliding window's fleet span totals, up to the pushed one
    level: int = -1  # a penalised key's level in the store (-1: no penalty)
    block_level: int = 0  # ... and the level its running block started at


@dataclass(frozen=True, slots=True)
class SyncResult:
    pushes: tuple[PushResult, ...] = ()
    totals: tuple[int, ...] = ()  # per TotalRead: the window's total, 0 if gone
    live_nodes: int = 0  # node-level estimate from heartbeats; 0 if unknown
    store_time_ms: int = 0  # the store's clock when it answered (Redis TIME); 0 if unknown
    heartbeat_error: str = ""  # why the batch's heartbeat failed ("": it did, or there was none)


@dataclass(frozen=True, slots=True)
class SyncStats:
    pushed_keys: int = 0
    pushed_hits: int = 0
    dropped_hits: int = 0
    blocked_keys: int = 0
    failed: bool = False  # the whole sync failed
    failed_keys: int = 0  # keys with a push the store answered but did not apply
    heartbeat_failed: bool = False  # the store answered, but not the node's heartbeat
    read_keys: int = 0  # window totals read without a push
    edge_pushes: int = 0  # pushes of keys at the edge (core/edge.py), of `pushed_keys`

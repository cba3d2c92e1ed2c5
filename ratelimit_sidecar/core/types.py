"""Values passed in and out of the limiter core. Plain data, no behaviour, no I/O."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from ratelimit_sidecar.config.model import RateLimit, Rule

# A counter's identity: (domain, key1, value1, key2, value2, ...) from the request entries.
KeyId = tuple[str, ...]


class Code(enum.IntEnum):
    """Same numbers as Envoy's `RateLimitResponse.Code`; the core never answers UNKNOWN."""

    OK = 1
    OVER_LIMIT = 2


# Hit, Verdict and Decision are built for every request: NamedTuples are immutable like frozen
# dataclasses but about ten times cheaper to construct.


class Hit(NamedTuple):
    """One request descriptor after matching: which rule, which counter, how many hits."""

    rule: Rule | None  # None: no rule matched this descriptor
    key: KeyId
    hits: int


class Verdict(NamedTuple):
    """What one descriptor got. `limit` None means no limit applies (unmatched or unlimited)."""

    code: Code
    limit: RateLimit | None = None
    unlimited: bool = False
    remaining: int = 0
    reset_ms: int = 0  # until the block ends when blocked, else until the window ends
    shadow_refused: bool = False  # over the limit, but answered OK because of shadow mode
    shadow: bool = False  # the rule is in shadow mode: counted, never enforced
    near_limit: bool = False


class Decision(NamedTuple):
    """The answer to one request: OVER_LIMIT if any descriptor is over (and not shadowed)."""

    code: Code
    verdicts: tuple[Verdict, ...]

    @property
    def retry_after_ms(self) -> int:
        """Longest wait among the descriptors that are over the limit."""
        waits = [v.reset_ms for v in self.verdicts if v.code is Code.OVER_LIMIT]
        return max(waits, default=0)


class Push(NamedTuple):
    """One counter delta to add to the shared store: INCRBY `key`:`window` `hits`."""

    key: KeyId
    window: int
    hits: int
    limit: RateLimit
    # The span the hits were counted in, numbered from the epoch (window * spans + index);
    # a sliding window counts per span. -1: the last span of `window`.
    span: int = -1
    # A penalised key's client offended: the penalty level asked for (core/penalty.py); 0: none.
    wanted_level: int = 0
    # ... and the level of the node's own running block of the key, -1 if none (flag_level).
    blocking_level: int = -1


@dataclass(frozen=True, slots=True)
class TotalRead:
    """Read a finished window's global total, for the nodes estimate."""

    key: KeyId
    window: int


@dataclass(slots=True)
class SyncBatch:
    """Everything one span end needs from the store, as one round trip.

    The store answers with a `SyncResult` whose lists line up with these lists.
    """

    now_ms: int
    pushes: list[Push] = field(default_factory=list)
    total_reads: list[TotalRead] = field(default_factory=list)
    heartbeat: bool = True  # register the node and count the live ones (once a period)

    def __bool__(self) -> bool:
        return bool(self.pushes or self.total_reads)


class PushResult(NamedTuple):
    total: int  # the counter's value after the INCRBY
    block_ms: int  # remaining time of the shared block flag, 0 if none
    # Why the store applied nothing for this push ("" when it did): the push failed alone, and
    # its count may be sent again because it was surely not counted.
    error: str = ""
    # A sliding window's fleet-wide span totals, oldest first, ending with the pushed span.
    spans: tuple[int, ...] = ()
    # A penalised key's level in the store (-1: the limit has no penalty), and the level its
    # running block started at (core/penalty.py).
    level: int = -1
    block_level: int = 0


@dataclass(frozen=True, slots=True)
class SyncResult:
    pushes: tuple[PushResult, ...] = ()
    totals: tuple[int, ...] = ()  # per TotalRead: the window's total, 0 if gone
    live_nodes: int = 0  # node-level estimate from heartbeats; 0 if unknown
    store_time_ms: int = 0  # the store's clock when it answered (Redis TIME); 0 if unknown
    heartbeat_error: str = ""  # why the batch's heartbeat failed ("": it did, or there was none)


@dataclass(frozen=True, slots=True)
class SyncStats:
    """What one `apply_sync` did, for metrics."""

    pushed_keys: int = 0
    pushed_hits: int = 0
    dropped_hits: int = 0
    blocked_keys: int = 0
    failed: bool = False  # the whole sync failed
    failed_keys: int = 0  # keys with a push the store answered but did not apply
    heartbeat_failed: bool = False  # the store answered, but not the node's heartbeat

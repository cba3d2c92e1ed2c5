"""What a request's bytes mean under the current rules, worked out once and remembered.

Envoy sends the same bytes again and again for a client on a route; parsing, validating, matching
and naming counters depend only on them and the rules, so caching by bytes makes most of a
decision one dict lookup. Bounded by entries and bytes, emptied whole at a bound or a rule change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ratelimit_sidecar.config.model import Rule
from ratelimit_sidecar.core import Hit, KeyId
from ratelimit_sidecar.core.limiter import Counter

DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_MAX_BYTES = 32 * 1024 * 1024  # request bytes held as keys
MAX_REQUEST_BYTES = 4096  # larger requests are rare and not worth holding


@dataclass(slots=True)  # not a NamedTuple: a slot is read in ~15 instructions, a field in ~170
class CompiledRequest:
    """`known` False: no rules for the domain. `counted`: the only descriptor with a (single,
    eventual) limit, else -1: the fast path, which reads its Hit from `rule`, `key`, `addend`
    (one object less in cache); `opening`, `after` and `head` are the encoded parts that never
    change when it is admitted. `tally`: the observer's counters."""

    domain: str
    hits: tuple[Hit, ...]
    known: bool
    tally: Any = None  # not `object`: mypyc's dataclass support fails on that annotation
    counted: int = -1
    rule: Rule | None = None
    key: KeyId = ()
    addend: int = 0
    opening: bytes = b""
    after: bytes = b""
    head: bytes = b""
    strict: bool = False  # a strict limit applies: decided by `StrictDecider` (awaits Redis)
    state: Counter = None  # `counted`'s counter, kept for `Limiter.hit_one` (evicted: till asked)


class RequestCache:
    __slots__ = ("_bytes", "_entries", "clears", "get", "max_bytes", "max_entries")

    def __init__(
        self, max_entries: int = DEFAULT_MAX_ENTRIES, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: dict[bytes, CompiledRequest] = {}
        # The dict's own lookup, bound once (every request calls it); `clear` empties the dict
        # in place so that this stays valid.
        self.get: Callable[[bytes], CompiledRequest | None] = self._entries.get
        self._bytes = 0
        self.clears = 0  # times a bound emptied the cache (a flood of distinct requests)

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, raw: bytes, compiled: CompiledRequest) -> None:
        size = len(raw)
        if size > MAX_REQUEST_BYTES or self.max_entries <= 0:
            return
        if len(self._entries) >= self.max_entries or self._bytes + size > self.max_bytes:
            self.clear()
            self.clears += 1
        self._entries[raw] = compiled
        self._bytes += size

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

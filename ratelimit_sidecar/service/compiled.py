"""What a request's bytes mean under the current rules, worked out once and remembered.

Envoy sends the same bytes again and again for a client on a route; parsing, validating, matching
and naming counters depend only on them and the rules, so caching by bytes makes most of a
decision one dict lookup. The cache is bounded by entries and bytes and emptied whole at a bound
or a rule change: a flood costs a clear per `max_entries` requests, never unbounded memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ratelimit_sidecar.core import Hit

DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_MAX_BYTES = 32 * 1024 * 1024  # request bytes held as keys
MAX_REQUEST_BYTES = 4096  # larger requests are rare and not worth holding


class CompiledRequest(NamedTuple):
    """`known` False: the domain has no rules. `tally`: the observer's counters. `counted`: the
    only descriptor with a (single) limit, else -1: the one fast path; `before`, `after` and
    `head` are the encoded parts that never change when it is admitted. A strict request never
    has `counted`."""

    domain: str
    hits: tuple[Hit, ...]
    known: bool
    tally: object = None
    counted: int = -1
    before: bytes = b""
    after: bytes = b""
    head: bytes = b""
    strict: bool = False  # a strict limit applies: decided by `StrictDecider` (awaits Redis)


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

"""What a request's bytes mean under the current rules, worked out once and remembered.

Envoy builds descriptors from headers, addresses and routes, so the same client on the same
route sends the very same request bytes again and again. Parsing, validating, matching the rule
tree and naming the counters depend only on those bytes and the rules; caching the result by the
bytes turns most of a decision into one dictionary lookup. Only the limiter's counters, which
change with every request, are consulted afresh.

The cache is bounded twice, by entry count and by the bytes it holds, and is emptied whole when
either bound is reached or the rules change: a flood of distinct requests costs one clear per
`max_entries` requests, never unbounded memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ratelimit_sidecar.core import Hit

DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_MAX_BYTES = 32 * 1024 * 1024  # request bytes held as keys
MAX_REQUEST_BYTES = 4096  # larger requests are rare and not worth holding


class CompiledRequest(NamedTuple):
    """A validated, matched request. `known` False: the domain has no rules (answer all OK).

    `tally` is whatever the decision observer asked to keep with the request (its counters).
    `counted` is the index of the request's only descriptor with a limit (of one limit), or -1
    if it has none or several: the one fast path (`Limiter.hit_one`, `ResponseEncoder.admitted`).
    The encoded statuses of the descriptors before and after it never change, nor does the start
    of its own when it is admitted (`head`: code and current limit). A request with a strict
    limit never has `counted`: it awaits the store (`strict`).
    """

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
    """Raw request bytes → CompiledRequest, for the rules in force when it was filled."""

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
        """Forget everything: the rules changed, or a bound was reached."""
        self._entries.clear()
        self._bytes = 0

"""What a request's bytes mean under the current rules, worked out once and remembered.

Envoy sends the same bytes again and again for a client on a route; parsing, validating, matching
and naming counters depend only on them and the rules, so caching by bytes makes most of a
decision one dict lookup. Bounded by entries and bytes, emptied whole at a bound or a rule change.
"""

from __future__ import annotations

from collections.abc import Callable

from ratelimit_sidecar.core import Hit
from ratelimit_sidecar.metrics.hot import Tally

DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_MAX_BYTES = 32 * 1024 * 1024  # request bytes held as keys
MAX_REQUEST_BYTES = 4096  # larger requests are rare and not worth holding


class CompiledRequest:
    """`known` False: no rules for the domain. `tally`: the observer's counters (None: no
    observer). `strict`: a strict limit applies, decided by `StrictDecider` (awaits Redis). A
    request with one counted descriptor is compiled as the fast path's `OneCounted`, which adds
    what that path keeps (service/fast_path.py). Slots, not a NamedTuple's fields: they are read
    on every request (docs/PERFORMANCE.md)."""

    __slots__ = ("domain", "hits", "known", "strict", "tally")

    def __init__(
        self,
        domain: str,
        hits: tuple[Hit, ...],
        known: bool,
        tally: Tally | None = None,
        strict: bool = False,
    ) -> None:
        self.domain, self.hits, self.known = domain, hits, known
        self.tally, self.strict = tally, strict


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

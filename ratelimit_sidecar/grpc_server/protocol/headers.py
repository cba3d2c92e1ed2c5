"""Request header blocks decoded with `hpack` (python-hyper), and what each asks cached with it.

A client sends the same block for the same kind of call: once its fields sit in the HPACK
dynamic table, the block is a few index octets. Decoding it again gives the same fields as long
as the table has not changed, so a block that added nothing to the table is kept, with its table
version and its checked RequestHead (validation.py), and the next call that repeats it costs a
dictionary lookup.

Every header block is decoded, even one on a stream that is refused, reset or ignored: the
dynamic table is shared by the whole connection (RFC 9113 §4.3). A block that does not decode
is a connection error COMPRESSION_ERROR; one whose decoded fields exceed the hard bound, a
connection error ENHANCE_YOUR_CALM (the advertised SETTINGS_MAX_HEADER_LIST_SIZE, smaller, is
answered per request: validation.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, cast

import hpack

from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol.limits import Counters
from ratelimit_sidecar.grpc_server.protocol.validation import RequestHead, Route, request_head

MAX_CACHED_BLOCKS: Final = 64  # per connection
MAX_CACHED_BLOCK: Final = 1024  # octets; a larger block is decoded each time


class HeaderBlocks:
    """One connection's HPACK decoder; the heads it returns are shared: callers never change
    them."""

    __slots__ = ("_counters", "_decoder", "_heads", "_max_list", "_route", "_table_version")

    def __init__(self, route: Route, max_list: int, hard_limit: int, counters: Counters) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=hard_limit)
        self._counters = counters
        self._route = route
        self._max_list = max_list
        self._heads: dict[bytes, tuple[int, RequestHead]] = {}
        self._table_version = 0

    def request(self, block: bytes) -> RequestHead:
        """What the request header block `block` asks, from the cache when it can be."""
        cached = self._heads.get(block)
        if cached is not None and cached[0] == self._table_version:
            return cached[1]
        table_changed, headers = self._decode(block)
        head = request_head(headers, self._route, self._max_list)
        if table_changed:
            self._table_version += 1  # indices now name other fields: the cache is stale
        elif len(block) <= MAX_CACHED_BLOCK:
            if len(self._heads) >= MAX_CACHED_BLOCKS:
                self._heads.clear()
            self._heads[block] = (self._table_version, head)
        return head

    def trailers(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """A trailer block's fields (never cached: a request has one)."""
        table_changed, headers = self._decode(block)
        if table_changed:
            self._table_version += 1
        return headers

    def _decode(self, block: bytes) -> tuple[bool, list[tuple[bytes, bytes]]]:
        # The table's entries as plain objects: compiled, a `tuple[bytes, bytes]` would be
        # unboxed, and the identity of the newest entry (is it still the one it was?) lost.
        entries = cast("Sequence[object]", self._decoder.header_table.dynamic_entries)
        count = len(entries)
        newest = entries[0] if count else None
        try:
            decoded = self._decoder.decode(block, raw=True)
        except hpack.OversizedHeaderListError as exc:
            self._counters.header_blocks_too_large += 1
            raise f.ConnectionFault(f.ENHANCE_YOUR_CALM, "header list too large") from exc
        except hpack.HPACKError as exc:
            raise f.ConnectionFault(f.COMPRESSION_ERROR, f"bad header block: {exc}") from exc
        headers = [(bytes(name), bytes(value)) for name, value in decoded]
        changed = len(entries) != count or (entries[0] if entries else None) is not newest
        return changed, headers


class BlockAssembler:
    """A header block gathered from HEADERS and the CONTINUATION frames after it (§4.3, §6.10):
    nothing may come between them, CONTINUATION may follow nothing else, and the block may not
    grow past the hard bound (ENHANCE_YOUR_CALM: a CONTINUATION flood)."""

    __slots__ = ("_counters", "_hard_limit", "block", "end_stream", "self_dependent", "stream_id")

    def __init__(self, hard_limit: int, counters: Counters) -> None:
        self._hard_limit = hard_limit
        self._counters = counters
        self.stream_id = 0  # the stream of a block still open, 0 when none is
        self.block = bytearray()
        self.end_stream = False  # the HEADERS frame's END_STREAM
        self.self_dependent = False  # its priority fields name its own stream (§5.3.1)

    def headers(self, flags: int, stream_id: int, payload: bytes) -> bytes | None:
        """A HEADERS frame: its whole block if it has END_HEADERS, else None (more to come)."""
        skip = 5 if flags & f.PRIORITY_FLAG else 0
        block = (
            f.unpadded(payload, flags, skip) if flags & (f.PADDED | f.PRIORITY_FLAG) else payload
        )
        offset = 1 if flags & f.PADDED else 0
        self.self_dependent = bool(skip) and f.priority_dependency(payload, offset) == stream_id
        self.end_stream = flags & f.END_STREAM != 0
        if flags & f.END_HEADERS:
            return block
        self.stream_id = stream_id
        self.block[:] = block
        return None

    def continuation(self, flags: int, stream_id: int, payload: bytes) -> bytes | None:
        if not self.stream_id or stream_id != self.stream_id:
            raise f.ConnectionFault(f.PROTOCOL_ERROR, "CONTINUATION outside a header block")
        self.block += payload
        if len(self.block) > self._hard_limit:
            self._counters.header_blocks_too_large += 1
            raise f.ConnectionFault(f.ENHANCE_YOUR_CALM, "header block too large")
        if not flags & f.END_HEADERS:
            return None
        block = bytes(self.block)
        self.block.clear()
        self.stream_id = 0
        return block

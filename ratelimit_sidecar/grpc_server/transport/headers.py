"""Request header blocks decoded with hpack (python-hyper), the repeats from a cache.

A client sends the same block for the same kind of call: once its headers sit in the dynamic
table, the block is a few index bytes. Decoding it again gives the same headers as long as the
table has not changed, so such blocks are kept with the table's version and reused.
"""

from __future__ import annotations

from typing import Any, cast

import hpack

from ratelimit_sidecar.grpc_server.transport.frames import ConnectionError_, ErrorCode

MAX_CACHED_BLOCKS = 64  # decoded header blocks kept per connection
MAX_CACHED_BLOCK = 1024  # bytes; larger blocks are decoded each time


class Decoded:
    """One decoded header block, and what the server made of it (`plan`, its cache)."""

    __slots__ = ("headers", "plan")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.headers = headers
        self.plan: Any = None


class BlockDecoder:
    """One connection's HPACK decoder; decoded lists are shared: callers must not change them."""

    def __init__(self, max_header_list_bytes: int) -> None:
        self._hpack = hpack.Decoder()
        self._hpack.max_header_list_size = max_header_list_bytes
        self._decoded: dict[bytes, tuple[int, Decoded]] = {}
        self.table_version = 0

    def decode(self, block: bytes) -> Decoded:
        """The block's headers. A client repeats the same block for the same call: a block that
        added nothing to the dynamic table, decoded since the table last changed, is reused."""
        cached = self._decoded.get(block)
        if cached is not None and cached[0] == self.table_version:
            return cached[1]
        entries = self._hpack.header_table.dynamic_entries
        newest, count = entries[0] if entries else None, len(entries)
        try:
            decoded = Decoded(cast(list[tuple[bytes, bytes]], self._hpack.decode(block, raw=True)))
        except hpack.OversizedHeaderListError as exc:
            raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, "header list too large") from exc
        except hpack.HPACKError as exc:
            raise ConnectionError_(ErrorCode.COMPRESSION_ERROR, f"bad header block: {exc}") from exc
        if len(entries) != count or (entries[0] if entries else None) is not newest:
            self.table_version += 1  # indices now name other headers: older entries are stale
        elif len(block) <= MAX_CACHED_BLOCK:
            if len(self._decoded) >= MAX_CACHED_BLOCKS:
                self._decoded.clear()
            self._decoded[block] = (self.table_version, decoded)
        return decoded

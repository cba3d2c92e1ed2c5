"""HTTP/2 wire pieces (RFC 9113) the transport writes: frame headers, settings, header blocks.

Header blocks are written as HPACK literals that never enter the peer's dynamic table, so the
responses' constant blocks are computed once and every connection can share them.
"""

from __future__ import annotations

import enum
import struct
from urllib.parse import quote

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = struct.Struct("!BHBBL")  # length (24 bits, split 8+16), type, flags, stream id

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0, 1, 2, 3, 4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 5, 6, 7, 8, 9
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

SETTINGS_HEADER_TABLE_SIZE = 1
SETTINGS_ENABLE_PUSH = 2
SETTINGS_MAX_CONCURRENT_STREAMS = 3
SETTINGS_INITIAL_WINDOW_SIZE = 4
SETTINGS_MAX_FRAME_SIZE = 5
SETTINGS_MAX_HEADER_LIST_SIZE = 6

DEFAULT_WINDOW = 65_535
DEFAULT_FRAME_SIZE = 16_384
MAX_WINDOW = 2**31 - 1
MAX_FRAME_SIZE_LIMIT = 2**24 - 1


class ErrorCode(enum.IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class ConnectionError_(Exception):
    """A connection error: the connection ends with GOAWAY carrying `code`."""

    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return FRAME_HEADER.pack(size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


def unpad(payload: bytes) -> bytes:
    """A PADDED frame's payload without its pad length byte and padding."""
    if not payload:
        raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "padded frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]


def settings(values: dict[int, int]) -> bytes:
    payload = b"".join(struct.pack("!HL", key, value) for key, value in values.items())
    return frame(SETTINGS, 0, 0, payload)


def goaway(last_stream_id: int, code: ErrorCode, reason: str = "") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack("!LL", last_stream_id, code) + reason.encode()[:256])


def rst_stream(stream_id: int, code: ErrorCode) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack("!L", code))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack("!L", increment))


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) whose first byte keeps the bits in `first`."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """One header as a literal without indexing, new name, no Huffman coding."""
    return b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value


STATUS_200 = b"\x88"  # :status 200, index 8 of the static table
GRPC_RESPONSE_HEADERS = STATUS_200 + literal(b"content-type", b"application/grpc")
GRPC_OK_TRAILERS = literal(b"grpc-status", b"0")
MAX_GRPC_MESSAGE_CHARS = 2048


def grpc_status_block(code: int, message: str, headers_too: bool) -> bytes:
    """grpc-status and a percent-encoded grpc-message; `headers_too` makes it trailers-only."""
    block = GRPC_RESPONSE_HEADERS if headers_too else b""
    block += literal(b"grpc-status", str(code).encode())
    if message:
        text = quote(message[:MAX_GRPC_MESSAGE_CHARS], safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")
        block += literal(b"grpc-message", text.encode())
    return block


def http_status_block(status: int) -> bytes:
    return literal(b":status", str(status).encode())

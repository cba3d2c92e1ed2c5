"""The header blocks a server sends, as HPACK literals that never enter the client's dynamic
table (RFC 7541 §6.2.2), so the constant ones are computed once and shared by all connections;
and the frames of a whole unary answer.

gRPC's response (PROTOCOL-HTTP2.md in grpc/grpc): HEADERS with `:status 200` and
`content-type: application/grpc`, the messages in DATA, then trailers with `grpc-status` and an
optional percent-encoded `grpc-message`. A call that fails before any message is answered
"trailers-only": one HEADERS frame with END_STREAM carrying both.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import quote

from ratelimit_sidecar.grpc_server.protocol import frames as f

MAX_GRPC_MESSAGE_CHARS: Final = 2048
_UNRESERVED: Final = " !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"  # printable ASCII but %


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) whose first octet keeps the bits in `first`."""
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
    """One field as a literal without indexing, with a new name, without Huffman coding."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


STATUS_200: Final = b"\x88"  # `:status 200`, entry 8 of the static table
GRPC_RESPONSE_HEADERS: Final = STATUS_200 + literal(b"content-type", b"application/grpc")
GRPC_OK_TRAILERS: Final = literal(b"grpc-status", b"0")
ACCEPT_IDENTITY: Final = literal(b"grpc-accept-encoding", b"identity")


def grpc_status_block(code: int, message: str, trailers_only: bool) -> bytes:
    """`grpc-status` and a percent-encoded `grpc-message`; `trailers_only` adds the headers."""
    block = GRPC_RESPONSE_HEADERS if trailers_only else b""
    block += literal(b"grpc-status", str(code).encode())
    if message:
        text = quote(message[:MAX_GRPC_MESSAGE_CHARS], safe=_UNRESERVED)
        block += literal(b"grpc-message", text.encode())
    return block


HTTP_REFUSALS: Final = {
    405: b"405 Method Not Allowed: this is a gRPC server, it answers POST\n",
    415: b"415 Unsupported Media Type: this is a gRPC server, send application/grpc\n",
    431: b"431 Request Header Fields Too Large\n",
}


def http_status_block(status: int) -> bytes:
    """The headers of an answer to a request that is not gRPC: its status, a text body."""
    return literal(b":status", str(status).encode()) + literal(b"content-type", b"text/plain")


# A whole unary answer, the three frames written at once: HEADERS, DATA, trailers. Only the
# stream identifier and the message's lengths change between answers.
_HEADERS_START: Final = f.FRAME_HEADER.pack(
    0, len(GRPC_RESPONSE_HEADERS), f.HEADERS, f.END_HEADERS, 0
)[:5]
_DATA_TYPE_AND_FLAGS: Final = bytes((f.DATA, 0))
_TRAILERS_START: Final = f.FRAME_HEADER.pack(
    0, len(GRPC_OK_TRAILERS), f.HEADERS, f.END_HEADERS | f.END_STREAM, 0
)[:5]


def unary_answer(stream_id: int, message: bytes) -> bytes:
    """HEADERS, one DATA frame with `message` framed, and OK trailers on `stream_id`."""
    stream = stream_id.to_bytes(4, "big")
    size = len(message)
    return b"".join((
        _HEADERS_START, stream, GRPC_RESPONSE_HEADERS,
        (size + 5).to_bytes(3, "big"), _DATA_TYPE_AND_FLAGS, stream, b"\0", size.to_bytes(4, "big"),
        message,
        _TRAILERS_START, stream, GRPC_OK_TRAILERS,
    ))  # fmt: skip

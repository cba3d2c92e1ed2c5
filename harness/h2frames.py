"""HTTP/2 wire constants and frame builders (RFC 9113) for the test clients: the harness's own,
so that the tests and benches that speak raw HTTP/2 do not depend on the transport they test
(whose internals move when it is rewritten)."""

from __future__ import annotations

import struct

# RFC 9113 §7's codes: facts, shared with the server's core, not its behaviour.
from ratelimit_sidecar.grpc_server.protocol.frames import ErrorCode, error_name

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = struct.Struct("!BHBBL")  # length (24 bits, split 8+16), type, flags, stream id

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0, 1, 2, 3, 4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 5, 6, 7, 8, 9
FRAME_NAMES = ("DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING",
               "GOAWAY", "WINDOW_UPDATE", "CONTINUATION")  # fmt: skip
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


def code_name(code: int) -> str:
    """An error code's name, or its number when RFC 9113 names none."""
    return error_name(code)


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return FRAME_HEADER.pack(size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


def settings(values: dict[int, int]) -> bytes:
    payload = b"".join(struct.pack("!HL", key, value) for key, value in values.items())
    return frame(SETTINGS, 0, 0, payload)


def settings_entries(entries: list[tuple[int, int]]) -> bytes:
    """A SETTINGS frame with `entries` in order, the same setting repeated if listed so."""
    return frame(SETTINGS, 0, 0, b"".join(struct.pack("!HL", k, v) for k, v in entries))


def settings_ack() -> bytes:
    return frame(SETTINGS, ACK, 0)


def ping(data: bytes = b"12345678") -> bytes:
    return frame(PING, 0, 0, data)


def goaway(last_stream_id: int, code: ErrorCode, reason: str = "") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack("!LL", last_stream_id, code) + reason.encode()[:256])


def rst_stream(stream_id: int, code: ErrorCode) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack("!L", code))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack("!L", increment))


def parse_settings(payload: bytes) -> dict[int, int]:
    """A SETTINGS frame's payload as {setting: value} (the last of a repeated one)."""
    return dict(struct.unpack_from("!HL", payload, i) for i in range(0, len(payload) - 5, 6))

"""HTTP/2 frames (RFC 9113 §4, §6): the numbers on the wire, the two kinds of error, the frame
builders, and the checks of each frame's layout that do not depend on a stream's state.

Every frame starts with a 9-octet header (§4.1): a 24-bit payload length, an 8-bit type, 8 bits
of flags and a 31-bit stream identifier after one reserved bit, which a receiver ignores. Flags a
type does not define are ignored too (§4.1), and so are frames of unknown types (§5.5).
"""

from __future__ import annotations

import enum
import struct
from typing import Final

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # §3.4, then the client's SETTINGS
# A frame header: length (8 + 16 bits), type, flags, stream id.
FRAME_HEADER: Final[struct.Struct] = struct.Struct("!BHBBL")

# Frame types (§6) and the flags each defines.
DATA: Final = 0
HEADERS: Final = 1
PRIORITY: Final = 2
RST_STREAM: Final = 3
SETTINGS: Final = 4
PUSH_PROMISE: Final = 5
PING: Final = 6
GOAWAY: Final = 7
WINDOW_UPDATE: Final = 8
CONTINUATION: Final = 9
FRAME_TYPES: Final = 10  # types 10 and up are unknown to this endpoint: ignored (§5.5)
FRAME_NAMES: Final = (
    "DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS",
    "PUSH_PROMISE", "PING", "GOAWAY", "WINDOW_UPDATE", "CONTINUATION",
)  # fmt: skip

END_STREAM: Final = 0x1
ACK: Final = 0x1  # SETTINGS and PING
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20  # HEADERS carries the deprecated priority fields (§6.2)

# SETTINGS parameters (§6.5.2, RFC 8441 §3, RFC 9218 §2.1).
SETTINGS_HEADER_TABLE_SIZE: Final = 0x1
SETTINGS_ENABLE_PUSH: Final = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 0x3
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
SETTINGS_MAX_FRAME_SIZE: Final = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE: Final = 0x6
SETTINGS_ENABLE_CONNECT_PROTOCOL: Final = 0x8
SETTINGS_NO_RFC7540_PRIORITIES: Final = 0x9

DEFAULT_WINDOW: Final = 65_535  # every window's size until SETTINGS say otherwise (§6.9.2)
DEFAULT_MAX_FRAME: Final = 16_384  # SETTINGS_MAX_FRAME_SIZE's initial value, and its floor
LARGEST_MAX_FRAME: Final = 2**24 - 1
MAX_WINDOW: Final = 2**31 - 1  # no flow-control window may exceed it (§6.9.1)

# Error codes (§7), as plain ints for the hot path; ErrorCode names them.
NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
SETTINGS_TIMEOUT: Final = 0x4
STREAM_CLOSED: Final = 0x5
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9
ENHANCE_YOUR_CALM: Final = 0xB


class ErrorCode(enum.IntEnum):
    """The error codes of RST_STREAM and GOAWAY (§7); unknown codes are legal and mean nothing."""

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


def error_name(code: int) -> str:
    return ErrorCode(code).name if code in ErrorCode._value2member_map_ else f"0x{code:x}"


class ConnectionFault(Exception):
    """A connection error (§5.4.1): GOAWAY with `code`, then the connection closes."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class StreamFault(Exception):
    """A stream error (§5.4.2): RST_STREAM with `code` on `stream_id`; the connection goes on."""

    def __init__(self, stream_id: int, code: int, reason: str) -> None:
        super().__init__(reason)
        self.stream_id = stream_id
        self.code = code
        self.reason = reason


# -- building frames ------------------------------------------------------------------------


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return FRAME_HEADER.pack(size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


def settings_frame(values: list[tuple[int, int]]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack("!HL", key, value) for key, value in values))


def goaway_frame(last_stream_id: int, code: int, reason: str) -> bytes:
    debug = reason.encode("utf-8", "replace")[:256]
    return frame(GOAWAY, 0, 0, struct.pack("!LL", last_stream_id, code) + debug)


def rst_stream_frame(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big"))


def window_update_frame(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))


# -- reading frames: the layout of each payload ------------------------------------------------


def unpadded(payload: bytes, flags: int, skip: int = 0) -> bytes:
    """A DATA or HEADERS payload without its padding (§6.1, §6.2) and `skip` octets of fields
    after the pad length (HEADERS' priority). Padding as long as what it pads, or longer, is a
    connection error PROTOCOL_ERROR; a payload too short for its fields, FRAME_SIZE_ERROR (§4.2)."""
    start, end = skip, len(payload)
    if flags & PADDED:
        if not payload:
            raise ConnectionFault(FRAME_SIZE_ERROR, "a padded frame without its pad length")
        start, end = start + 1, end - payload[0]
        if payload[0] >= len(payload) - skip:
            raise ConnectionFault(PROTOCOL_ERROR, "padding as long as the frame payload")
    if start > len(payload):
        raise ConnectionFault(FRAME_SIZE_ERROR, "a frame too short for its fields")
    return payload[start:end] if start or end != len(payload) else payload


def priority_dependency(payload: bytes, offset: int) -> int:
    """The stream a priority field depends on (§5.3.1, §6.3), its exclusive bit dropped."""
    return int.from_bytes(payload[offset : offset + 4], "big") & 0x7FFFFFFF


def settings_entries(payload: bytes) -> list[tuple[int, int]]:
    """A SETTINGS payload's (identifier, value) pairs, each checked as §6.5.2 asks (unknown
    identifiers are ignored: §6.5.2's last paragraph). Out-of-range values are connection
    errors: FLOW_CONTROL_ERROR for the initial window, PROTOCOL_ERROR for the others."""
    if len(payload) % 6:
        raise ConnectionFault(FRAME_SIZE_ERROR, "a SETTINGS payload not a multiple of 6 octets")
    entries = []
    for offset in range(0, len(payload), 6):
        key = payload[offset] << 8 | payload[offset + 1]
        value = int.from_bytes(payload[offset + 2 : offset + 6], "big")
        _check_setting(key, value)
        entries.append((key, value))
    return entries


def _check_setting(key: int, value: int) -> None:
    if key == SETTINGS_INITIAL_WINDOW_SIZE and value > MAX_WINDOW:
        raise ConnectionFault(FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value}")
    if key == SETTINGS_MAX_FRAME_SIZE and not DEFAULT_MAX_FRAME <= value <= LARGEST_MAX_FRAME:
        raise ConnectionFault(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value}")
    boolean = (
        SETTINGS_ENABLE_PUSH,
        SETTINGS_ENABLE_CONNECT_PROTOCOL,
        SETTINGS_NO_RFC7540_PRIORITIES,
    )
    if key in boolean and value > 1:
        raise ConnectionFault(PROTOCOL_ERROR, f"SETTINGS parameter 0x{key:x} set to {value}")


def check_stream_zero(kind: int, stream_id: int) -> None:
    """SETTINGS, PING and GOAWAY belong to the connection (stream 0), the other types to a
    stream: either on the wrong one is a connection error PROTOCOL_ERROR (§6.1-§6.10)."""
    on_connection = kind in (SETTINGS, PING, GOAWAY)
    if on_connection != (stream_id == 0) and kind != WINDOW_UPDATE:
        where = "a stream" if on_connection else "stream 0"
        raise ConnectionFault(PROTOCOL_ERROR, f"{FRAME_NAMES[kind]} on {where}")


def check_fixed_length(kind: int, length: int) -> None:
    """The frames of a fixed size (§6.4, §6.7, §6.9) and GOAWAY's minimum (§6.8): any other size
    is a connection error FRAME_SIZE_ERROR. PRIORITY's is a stream error (§6.3): see there."""
    if (
        (kind == RST_STREAM and length != 4)
        or (kind == PING and length != 8)
        or (kind == WINDOW_UPDATE and length != 4)
        or (kind == GOAWAY and length < 8)
    ):
        raise ConnectionFault(FRAME_SIZE_ERROR, f"{FRAME_NAMES[kind]} of {length} octets")

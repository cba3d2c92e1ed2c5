"""The bounds of one connection, the count of their trips, and the control-frame budget.

Why the windows are these sizes (the receive side of RFC 9113 §6.9 and §5.2):
- Request octets live in one of three places. (1) A message spanning DATA frames, or a unary
  message waiting for its END_STREAM, is buffered by the core: MessageBudget counts those
  octets for the whole process and refuses a message it has no room for, so their connection
  credit can go back as soon as they arrive. (2) A streaming call's messages handed to the
  adapter and not yet consumed: their credit, stream and connection, goes back only when the
  adapter consumes them, so the stream window bounds each stream's backlog and the connection
  window all of a connection's. (3) Everything else (unary messages handed out, padding,
  octets of refused or reset streams) is credited back at once.
- So `connection_window` bounds only (2), the streaming backlog a connection may push on the
  adapter: 1 MiB is sixteen stream windows, room for every RLQS stream Envoy opens on one
  connection. Advertising more (16 MiB before) bought nothing: unary traffic is credited back
  in the same turn, and a large message is credited as its octets are reserved.
- `stream_window` stays the protocol's default (64 KiB, no SETTINGS entry, no per-stream
  WINDOW_UPDATE for a unary call): a message larger than it is reserved whole, and the window
  is granted ahead as far as the message needs.
- The budget (MessageBudget, one per process) is sized by the adapter; `max_message_bytes`
  bounds one message, so the budget should hold several.

Frames that ask work of us without a request take tokens from two buckets per connection,
refilled by time alone, never by requests, so a client cannot earn them by interleaving calls:
- `chatter` (`chatter_frames_per_s`, up to `chatter_frames_burst`): PING, SETTINGS, PRIORITY,
  empty DATA and CONTINUATION, unknown frame types, and a WINDOW_UPDATE giving back more than we
  sent. A client sends these rarely: gRPC keepalive is a PING per 10 s or slower (Envoy's HTTP/2
  keepalive likewise), SETTINGS a few per connection.
- `control` (`control_frames_per_s`, up to `control_frames_burst`): RST_STREAM and refused or
  reset streams: a busy client cancels calls often (Envoy, under overload).
A WINDOW_UPDATE giving back what we sent costs nothing: grpc's C-core client credits every
answer it reads, and the credit is bounded by the answers themselves.
A flood empties a bucket: GOAWAY ENHANCE_YOUR_CALM, as gRPC answers too many pings
("too_many_pings").
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final

from ratelimit_sidecar.grpc_server.protocol import frames as f

KIB: Final = 1024
MIB: Final = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """A connection's bounds; each has the default the module's docstring argues for."""

    max_concurrent_streams: int = 1024  # advertised; more HEADERS are refused (REFUSED_STREAM)
    max_message_bytes: int = 4 * MIB  # gRPC's usual default; the adapter derives its own
    stream_window: int = 65_535  # advertised SETTINGS_INITIAL_WINDOW_SIZE
    connection_window: int = MIB
    max_header_list_bytes: int = 16 * KIB  # advertised; over it the call is refused
    hard_header_bytes: int = 64 * KIB  # a header block over it, coded or decoded: GOAWAY
    max_frame_bytes: int = 16_384  # advertised SETTINGS_MAX_FRAME_SIZE
    unary_receive_timeout_s: float = 10.0  # HEADERS to the request's end, for a unary call
    stream_idle_timeout_s: float = 300.0  # between a streaming call's request messages
    handshake_timeout_s: float = 10.0  # connection to the client's preface and SETTINGS
    settings_ack_timeout_s: float = 10.0  # our SETTINGS to the client's ACK
    control_frames_per_s: float = 1000.0  # RST_STREAM, refused streams
    control_frames_burst: int = 2000
    chatter_frames_per_s: float = 20.0  # PING, SETTINGS, PRIORITY, empty frames, extra credit
    chatter_frames_burst: int = 200
    frames_per_turn: int = 256  # frames one `receive` handles; the rest wait for the next
    remembered_resets: int = 1024  # streams we reset whose late frames are dropped quietly

    def __post_init__(self) -> None:
        """Values HTTP/2 can advertise (RFC 9113 §6.5.2), and bounds that leave room to work."""
        if not f.DEFAULT_MAX_FRAME <= self.max_frame_bytes <= f.LARGEST_MAX_FRAME:
            raise ValueError(f"max_frame_bytes {self.max_frame_bytes}: 16,384 to 2^24-1")
        for name in ("stream_window", "connection_window"):
            if not 0 < getattr(self, name) <= f.MAX_WINDOW:
                raise ValueError(f"{name} {getattr(self, name)}: 1 to 2^31-1")
        if self.max_header_list_bytes > self.hard_header_bytes:
            raise ValueError("max_header_list_bytes over hard_header_bytes")
        if min(self.max_concurrent_streams, self.frames_per_turn, self.control_frames_burst) < 1:
            raise ValueError("streams, frames per turn and the control burst must be 1 or more")

    def preface(self) -> bytes:
        """Our SETTINGS (RFC 9113 §3.4: the server's first frame), then the connection window's
        growth past its default (§6.9.2: SETTINGS cannot change it)."""
        values = [
            (f.SETTINGS_MAX_CONCURRENT_STREAMS, self.max_concurrent_streams),
            (f.SETTINGS_MAX_HEADER_LIST_SIZE, self.max_header_list_bytes),
            (f.SETTINGS_ENABLE_PUSH, 0),
        ]
        if self.stream_window != f.DEFAULT_WINDOW:
            values.append((f.SETTINGS_INITIAL_WINDOW_SIZE, self.stream_window))
        if self.max_frame_bytes != f.DEFAULT_MAX_FRAME:
            values.append((f.SETTINGS_MAX_FRAME_SIZE, self.max_frame_bytes))
        preface = f.settings_frame(values)
        if self.connection_window > f.DEFAULT_WINDOW:
            preface += f.window_update_frame(0, self.connection_window - f.DEFAULT_WINDOW)
        return preface


COUNTER_NAMES: Final = (
    "budget_refusals", "closed_idle_streams", "connection_errors", "control_floods",
    "deadlines", "frames_too_large", "handshake_timeouts", "header_blocks_too_large",
    "header_lists_too_large", "malformed_requests", "messages_too_large",
    "receive_timeouts", "refused_streams", "settings_timeouts", "stream_errors", "turns_cut",
)  # fmt: skip


class Counters:
    """How often each bound tripped; one object may serve every connection of a process."""

    __slots__ = COUNTER_NAMES

    def __init__(self) -> None:
        self.budget_refusals = 0  # messages refused: the process's message budget was full
        self.closed_idle_streams = 0  # streaming calls without a message for too long
        self.connection_errors = 0  # GOAWAY with an error code, whatever the cause
        self.control_floods = 0  # GOAWAY ENHANCE_YOUR_CALM: the control-frame budget ran out
        self.deadlines = 0  # calls ended by their grpc-timeout
        self.frames_too_large = 0
        self.handshake_timeouts = 0
        self.header_blocks_too_large = 0  # over hard_header_bytes: GOAWAY ENHANCE_YOUR_CALM
        self.header_lists_too_large = 0  # over max_header_list_bytes: the call refused
        self.malformed_requests = 0  # RFC 9113 §8.1.1: RST_STREAM PROTOCOL_ERROR
        self.messages_too_large = 0  # over max_message_bytes: RESOURCE_EXHAUSTED
        self.receive_timeouts = 0  # unary requests not whole within unary_receive_timeout_s
        self.refused_streams = 0  # over max_concurrent_streams, or after GOAWAY
        self.settings_timeouts = 0
        self.stream_errors = 0  # RST_STREAM with an error code, whatever the cause
        self.turns_cut = 0  # reads that had more than frames_per_turn frames

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COUNTER_NAMES}


def limit_names() -> list[str]:
    return [field.name for field in fields(Limits)]


class ControlBudget:
    """A token bucket refilled by time alone (see the module's docstring)."""

    __slots__ = ("burst", "per_s", "since", "tokens")

    def __init__(self, per_s: float, burst: int, now: float) -> None:
        self.per_s = per_s
        self.burst = float(burst)
        self.tokens = float(burst)
        self.since = now

    def spend(self, now: float) -> bool:
        """Take a token; False when there is none left."""
        if now > self.since:
            self.tokens = min(self.burst, self.tokens + (now - self.since) * self.per_s)
            self.since = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

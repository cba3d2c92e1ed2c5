"""The protocol core's fuzz target: one function, `run(data)`, that drives a server Connection
(ratelimit_sidecar/grpc_server/protocol/connection.py) with the octets of `data` and checks its
invariants after every call. atheris runs it (protocol_fuzz.py, coverage-guided); hypothesis
runs it in CI (tests/unit/grpc_server/protocol/test_fuzz_smoke.py).

`data[0]` picks the mode and `data[1]` the Limits (the defaults, tight bounds that trip every
limit, or large windows and frames):

- raw (mode byte even): the rest is the client's byte stream, preface included, cut into
  chunks whose sizes come from the stream itself; after each chunk, every unary call the
  adapter holds is answered and the clock moves on half a second (timers fire when due).
- structured (mode byte odd): the preface, an empty SETTINGS and the ACK of ours are sent
  first, so the fuzzer starts past the handshake; the rest is a list of operations, each an
  opcode octet and its arguments: raw octets, a request HEADERS built with a real HPACK
  encoder (a valid gRPC request or one of its mutations), a DATA frame with a gRPC message, a
  control frame, the clock moving on (`on_timer` when due), the adapter's answers
  (`answer_unary`, `send_message`/`end_call`, `reset`, `message_consumed`), `drain`, `close`,
  `receive(b"")` and `connection_lost`.

Invariants, after every call into the core (a failure raises AssertionError; any other
exception escaping the core is a finding too: every malformed input must become an event, a
GOAWAY or a RST_STREAM):
- what `data_to_send()` returns is a whole number of well-formed HTTP/2 frames: server frame
  types only, on the right streams, of valid lengths, within the client's SETTINGS_MAX_FRAME_SIZE,
  HEADERS with END_HEADERS that decode with the client's HPACK decoder, no DATA or HEADERS on a
  stream after the server ended or reset it, no DATA before response headers, no DATA beyond
  the connection window the client granted, nothing after a GOAWAY with an error code;
- the events make sense in order: StreamReset, Message and RequestEnded only for calls the
  adapter holds, ConnectionEnded last and only when `closing`;
- open streams never exceed `max_concurrent_streams`; the MessageBudget's `used` never drops
  below 0, and is back to 0 whenever the connection holds no stream (after it is lost or
  closed, in particular).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

import hpack

from ratelimit_sidecar.grpc_server.protocol import events as ev
from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol.connection import Connection
from ratelimit_sidecar.grpc_server.protocol.limits import Counters, Limits
from ratelimit_sidecar.grpc_server.protocol.messages import MessageBudget
from ratelimit_sidecar.grpc_server.protocol.validation import STREAMING, UNARY, UNKNOWN_METHOD

UNARY_PATH: Final = b"/test.Service/Unary"
STREAM_PATH: Final = b"/test.Service/Stream"
ROUTES: Final = {UNARY_PATH: UNARY, STREAM_PATH: STREAMING}
HANDSHAKE: Final = f.PREFACE + f.settings_frame([]) + f.frame(f.SETTINGS, f.ACK, 0)
RAW_STEP_S: Final = 0.5

# (limits, message budget capacity): the defaults; tight bounds every input can trip; large.
LIMITS: Final = (
    (Limits(), 64 * 1024 * 1024),
    (
        Limits(
            max_concurrent_streams=3, max_message_bytes=64, stream_window=100,
            connection_window=300, max_header_list_bytes=200, hard_header_bytes=600,
            unary_receive_timeout_s=1.0, stream_idle_timeout_s=2.0, handshake_timeout_s=1.0,
            settings_ack_timeout_s=3.0, control_frames_per_s=5.0, control_frames_burst=40,
            frames_per_turn=4, remembered_resets=2,
        ),
        150,
    ),
    (
        Limits(
            max_concurrent_streams=100, max_message_bytes=1 << 20, stream_window=f.MAX_WINDOW,
            connection_window=f.MAX_WINDOW, max_frame_bytes=f.LARGEST_MAX_FRAME,
        ),
        1 << 22,
    ),
)  # fmt: skip
SERVER_TYPES: Final = frozenset(
    (f.DATA, f.HEADERS, f.RST_STREAM, f.SETTINGS, f.PING, f.GOAWAY, f.WINDOW_UPDATE)
)
CONNECTION_TYPES: Final = frozenset((f.SETTINGS, f.PING, f.GOAWAY))
GRPC_STATUSES: Final = (0, 1, 4, 8, 13, 14)
# Findings already reported, with a failing test each; `run` tolerates them unless `strict`,
# so that a long run goes on to find others.
KNOWN_FINDINGS: Final[tuple[str, ...]] = ()  # the first, RST_STREAM on an idle stream, is fixed


def route(path: bytes) -> int:
    return ROUTES.get(path, UNKNOWN_METHOD)


class Input:
    """The fuzzer's octets, read front to back; past the end every read gives zeros."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def u16(self) -> int:
        return self.byte() << 8 | self.byte()

    def take(self, count: int) -> bytes:
        chunk = self.data[self.pos : self.pos + count]
        self.pos += len(chunk)
        return chunk


@dataclass
class ClientView:
    """What a client reads from the server, and what it sent that bounds it."""

    decoder: hpack.Decoder = field(default_factory=hpack.Decoder)
    sent: bytearray = field(default_factory=bytearray)  # the client's stream, as sent
    scanned: int = 0  # how far `sent` was scanned for frames
    max_frame: int = f.DEFAULT_MAX_FRAME  # the largest SETTINGS_MAX_FRAME_SIZE the client sent
    granted: int = f.DEFAULT_WINDOW  # the connection window: the default and every increment
    data_received: int = 0
    headers_seen: set[int] = field(default_factory=set)
    ended: set[int] = field(default_factory=set)  # streams the server ended or reset
    goaway_error: bool = False
    newest_request: int = 0  # the client's newest HEADERS stream: any above it is idle
    strict: bool = False  # KNOWN_FINDINGS fail too
    findings: list[str] = field(default_factory=list)  # the known ones met, when not strict

    def client_sent(self, data: bytes) -> None:
        """Scan the client's frames for what bounds the server: max frame size, window grants.
        Frames the core never read count too, so the bounds are upper bounds."""
        self.sent += data
        buf = self.sent
        if self.scanned == 0:
            if len(buf) < len(f.PREFACE):
                return
            self.scanned = len(f.PREFACE)
        while len(buf) - self.scanned >= 9:
            pos = self.scanned
            length = int.from_bytes(buf[pos : pos + 3], "big")
            if len(buf) - pos - 9 < length:
                return
            kind, flags = buf[pos + 3], buf[pos + 4]
            stream_id = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            payload = bytes(buf[pos + 9 : pos + 9 + length])
            self.scanned = pos + 9 + length
            if kind == f.SETTINGS and not flags & f.ACK:
                for offset in range(0, len(payload) - 5, 6):
                    key, value = struct.unpack_from("!HL", payload, offset)
                    if key == f.SETTINGS_MAX_FRAME_SIZE and value <= f.LARGEST_MAX_FRAME:
                        self.max_frame = max(self.max_frame, value)
            elif kind == f.HEADERS:
                self.newest_request = max(self.newest_request, stream_id)
            elif kind == f.WINDOW_UPDATE and stream_id == 0 and length == 4:
                self.granted += int.from_bytes(payload, "big") & 0x7FFFFFFF

    def known(self, finding: str, detail: str) -> None:
        """A known finding (KNOWN_FINDINGS): recorded, or a failure when strict."""
        assert not self.strict, f"{finding}: {detail}"
        self.findings.append(finding)

    def server_sent(self, out: bytes) -> None:
        """Check what the server wrote: whole, well-formed frames a client may receive."""
        pos = 0
        while pos < len(out):
            assert not self.goaway_error, "a frame after GOAWAY with an error code"
            assert len(out) - pos >= 9, "a frame header cut short"
            length = int.from_bytes(out[pos : pos + 3], "big")
            kind, flags = out[pos + 3], out[pos + 4]
            stream_id = int.from_bytes(out[pos + 5 : pos + 9], "big")
            payload = out[pos + 9 : pos + 9 + length]
            assert len(payload) == length, "a frame cut short"
            pos += 9 + length
            self._frame(kind, flags, stream_id, payload)

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        length = len(payload)
        assert kind in SERVER_TYPES, f"the server sent a frame of type {kind}"
        assert not stream_id >> 31, "the reserved bit set"
        assert length <= self.max_frame, f"a frame of {length} octets over the client's maximum"
        if kind in CONNECTION_TYPES:
            assert stream_id == 0, f"type {kind} on stream {stream_id}"
        elif kind not in (f.WINDOW_UPDATE, f.RST_STREAM):  # RST_STREAM: see below
            assert stream_id & 1, f"type {kind} on stream {stream_id}"
        if kind == f.SETTINGS:
            assert not (length % 6 if not flags & f.ACK else length), "a bad SETTINGS"
        elif kind == f.PING:
            assert length == 8 and flags & f.ACK, "a PING that is not an ACK of 8 octets"
        elif kind == f.GOAWAY:
            assert length >= 8
            last, code = struct.unpack_from("!LL", payload)
            assert not last & 1 << 31
            self.goaway_error = self.goaway_error or code != f.NO_ERROR
        elif kind == f.WINDOW_UPDATE:
            assert length == 4
            assert 0 < int.from_bytes(payload, "big") <= f.MAX_WINDOW, "a bad WINDOW_UPDATE"
        elif kind == f.RST_STREAM:
            assert length == 4
            assert stream_id, "RST_STREAM on stream 0"
            idle = stream_id > self.newest_request or not stream_id & 1
            assert not idle, f"RST_STREAM on idle stream {stream_id} (RFC 9113 §6.4)"
            self.ended.add(stream_id)
        elif kind == f.HEADERS:
            assert stream_id not in self.ended, f"HEADERS on ended stream {stream_id}"
            assert flags & f.END_HEADERS and not flags & (f.PADDED | f.PRIORITY_FLAG)
            fields = dict(self.decoder.decode(payload, raw=True))
            if stream_id not in self.headers_seen:
                assert b":status" in fields, "response headers without :status"
            self.headers_seen.add(stream_id)
            if flags & f.END_STREAM:
                self.ended.add(stream_id)
        else:  # DATA
            assert stream_id in self.headers_seen, f"DATA before headers on stream {stream_id}"
            assert stream_id not in self.ended, f"DATA on ended stream {stream_id}"
            assert not flags & f.PADDED
            self.data_received += length
            assert self.data_received <= self.granted, "DATA beyond the connection window"
            if flags & f.END_STREAM:
                self.ended.add(stream_id)


class Harness:
    """One connection, the adapter around it and the client's view of it."""

    def __init__(self, variant: int, strict: bool = False) -> None:
        self.limits, capacity = LIMITS[variant % len(LIMITS)]
        self.budget = MessageBudget(capacity)
        self.now = 0.0
        self.core = Connection(self.limits, self.budget, route, self.now, Counters())
        self.client = ClientView(strict=strict)
        self.encoder = hpack.Encoder()
        self.unary: list[int] = []  # unary calls the adapter holds, oldest first
        self.streaming: dict[int, int] = {}  # streaming calls held: messages not consumed
        self.held: set[int] = set()
        self.lost = False
        self.check([])

    # -- calls into the core, each checked -------------------------------------------------

    def send(self, data: bytes) -> None:
        self.client.client_sent(data)
        self.check(self.core.receive(data, self.now))
        if data and self.core.backlogged and not self.core.closing:
            self.check(self.core.receive(b"", self.now))

    def tick(self, seconds: float) -> None:
        self.now += seconds
        due = self.core.next_timer()
        if due is not None and due <= self.now:
            self.check(self.core.on_timer(self.now))

    def check(self, events: list[ev.Event]) -> None:
        core = self.core
        self.client.server_sent(core.data_to_send())
        for index, event in enumerate(events):
            self._event(event, index == len(events) - 1)
        assert len(core.streams) <= self.limits.max_concurrent_streams, "too many streams"
        assert self.budget.used >= 0, f"budget used {self.budget.used}"
        if not core.streams:
            assert self.budget.used == 0, f"budget used {self.budget.used}, no stream open"
        if core.closing:
            assert not core.streams
            assert core.next_timer() is None

    def _event(self, event: ev.Event, last: bool) -> None:
        held = self.held
        if isinstance(event, ev.UnaryRequest):
            assert event.stream_id not in held, "a call handed out twice"
            held.add(event.stream_id)
            self.unary.append(event.stream_id)
        elif isinstance(event, ev.RequestStarted):
            assert event.stream_id not in held, "a call handed out twice"
            held.add(event.stream_id)
            self.streaming[event.stream_id] = 0
        elif isinstance(event, ev.Message):
            assert event.stream_id in self.streaming, "a Message for no streaming call"
            self.streaming[event.stream_id] += 1
        elif isinstance(event, ev.RequestEnded):
            assert event.stream_id in self.streaming, "RequestEnded for no streaming call"
        elif isinstance(event, ev.StreamReset):
            assert event.stream_id in held, f"StreamReset for stream {event.stream_id} not held"
            self._drop(event.stream_id)
        elif isinstance(event, ev.ConnectionEnded):
            assert last and self.core.closing, "ConnectionEnded not last, or not closing"
            for stream_id in list(held):
                self._drop(stream_id)

    def _drop(self, stream_id: int) -> None:
        self.held.discard(stream_id)
        self.streaming.pop(stream_id, None)
        if stream_id in self.unary:
            self.unary.remove(stream_id)

    def _after_answer(self) -> None:
        """An answer ends a call the core may forget: drop what the adapter holds of it."""
        for stream_id in list(self.held):
            if stream_id not in self.core.streams:
                self._drop(stream_id)
        self.check([])

    # -- the adapter's answers ---------------------------------------------------------------

    def answer_all(self) -> None:
        for stream_id in list(self.unary):
            self.core.answer_unary(stream_id, b"ok")
        self._after_answer()

    def answer(self, data: Input) -> None:
        choice, pick = data.byte(), data.byte()
        calls = self.unary + list(self.streaming)
        if not calls:
            return
        stream_id = calls[pick % len(calls)]
        size = (data.byte() << 6) * (1 + (choice >> 4))  # up to ~250 KiB
        message = bytes(size)
        action = choice % 6
        if action == 0:
            self.core.answer_unary(stream_id, message)
        elif action == 1:
            self.core.send_message(stream_id, message)
        elif action == 2:
            self.core.send_headers(stream_id)
        elif action == 3:
            status = GRPC_STATUSES[data.byte() % len(GRPC_STATUSES)]
            self.core.end_call(stream_id, status, "why" if status else "")
        elif action == 4:
            self.core.reset(stream_id, data.byte() % 14)
        elif self.streaming.get(stream_id):
            self.streaming[stream_id] -= 1
            self.core.message_consumed(stream_id)
        self._after_answer()

    def lose(self) -> None:
        self.core.connection_lost()
        self.lost = True
        self.check([])
        assert self.budget.used == 0, "budget not released after connection_lost"


# -- the frames of the structured mode --------------------------------------------------------

BASE_FIELDS: Final = (
    (b":method", b"POST"), (b":scheme", b"http"), (b":path", UNARY_PATH),
    (b":authority", b"localhost"), (b"te", b"trailers"), (b"content-type", b"application/grpc"),
)  # fmt: skip
EXTRA_FIELDS: Final = (
    (b"grpc-timeout", b"1S"), (b"grpc-timeout", b"100m"), (b"grpc-timeout", b"x"),
    (b"content-length", b"10"), (b"content-length", b"0"), (b"grpc-encoding", b"gzip"),
    (b"user-agent", b"fuzz"), (b"host", b"localhost"), (b"host", b"other"), (b"x-big", b"v" * 300),
    (b"connection", b"close"), (b"te", b"gzip"), (b"Upper", b"x"), (b":status", b"200"),
    (b":path", b"/again"), (b"x-nul", b"a\x00b"), (b"x-space", b" a"), (b"content-length", b"a"),
)  # fmt: skip


def request_fields(data: Input) -> list[tuple[bytes, bytes]]:
    """A gRPC request's fields, then up to three mutations picked by the input."""
    fields = list(BASE_FIELDS)
    path = data.byte() % 5
    if path == 1:
        fields[2] = (b":path", STREAM_PATH)
    elif path == 2:
        fields[2] = (b":path", b"/unknown.Service/Method")
    elif path == 3:
        fields[2] = (b":path", b"")
    for _ in range(data.byte() % 4):
        mutation, at = data.byte(), data.byte() % (len(fields) + 1)
        kind = mutation % 6
        if kind == 0:
            fields.insert(at, EXTRA_FIELDS[(mutation >> 3) % len(EXTRA_FIELDS)])
        elif kind == 1 and fields:
            del fields[at % len(fields)]
        elif kind == 2 and fields:
            fields.insert(at, fields[(mutation >> 3) % len(fields)])  # a duplicate
        elif kind == 3:
            fields[0] = (b":method", (b"GET", b"PUT", b"CONNECT", b"POST")[(mutation >> 3) % 4])
        elif kind == 4:
            fields[-1] = (
                b"content-type",
                (b"text/plain", b"application/grpc+proto")[(mutation >> 3) & 1],
            )
        else:
            fields.append((data.take(data.byte() % 16), data.take(data.byte() % 16)))
    return fields


def headers_frames(harness: Harness, data: Input) -> bytes:
    stream_id = stream_id_of(data)
    flags = data.byte()
    block = harness.encoder.encode(request_fields(data))
    end = flags & f.END_STREAM
    prefix = b""
    if flags & f.PRIORITY_FLAG:  # on itself, or on another stream
        depends = stream_id if flags & 0x40 else data.byte()
        prefix = depends.to_bytes(4, "big") + bytes((data.byte(),))
    pad = data.byte() % 8 if flags & f.PADDED else 0
    if flags & f.PADDED:
        prefix = bytes((pad,)) + prefix
    frame_flags = end | (flags & (f.PADDED | f.PRIORITY_FLAG))
    if flags & 0x80 and len(block) > 1:  # the block split over CONTINUATION
        cut = 1 + data.byte() % (len(block) - 1)
        first = f.frame(f.HEADERS, frame_flags, stream_id, prefix + block[:cut] + bytes(pad))
        last_flags = f.END_HEADERS if not flags & 0x02 else 0  # 0x02: left open
        return first + f.frame(f.CONTINUATION, last_flags, stream_id, block[cut:])
    payload = prefix + block + bytes(pad)
    return f.frame(f.HEADERS, frame_flags | f.END_HEADERS, stream_id, payload)


def data_frame(data: Input) -> bytes:
    stream_id = stream_id_of(data)
    flags, kind, size = data.byte(), data.byte(), data.byte()
    size *= 1 + (kind >> 4)  # a message of up to ~4 KiB
    shape = kind % 4
    if shape == 0:
        payload = b"\0" + size.to_bytes(4, "big") + bytes(size)  # one whole message
    elif shape == 1:  # a message's start: the rest comes in later DATA
        payload = b"\0" + (size * 4).to_bytes(4, "big") + bytes(size)
    elif shape == 2:
        payload = bytes(size)  # the rest of a message, or zeros
    else:
        payload = data.take(size % 64)  # anything
    if flags & f.PADDED:
        pad = data.byte() % 16
        payload = bytes((pad,)) + payload + bytes(pad)
    return f.frame(f.DATA, flags & (f.END_STREAM | f.PADDED), stream_id, payload)


def control_frame(data: Input) -> bytes:
    kind, flags, stream = data.byte(), data.byte(), data.byte()
    kind = kind % 12 if kind < 0xF0 else kind  # now and then an unknown type
    stream_id = 0 if stream < 0x80 else stream_id_of(data)
    length = data.byte()
    if length < 0xC0:  # the usual length of the type
        length = {f.RST_STREAM: 4, f.PING: 8, f.GOAWAY: 8, f.WINDOW_UPDATE: 4, f.PRIORITY: 5}.get(
            kind, (length % 4) * 6
        )
    else:
        length %= 32
    return f.frame(kind, flags, stream_id, data.take(length).ljust(length, b"\0"))


def stream_id_of(data: Input) -> int:
    """Mostly odd, small identifiers, so that frames meet the streams opened."""
    value = data.byte()
    if value >= 0xF0:
        return int.from_bytes(data.take(4).ljust(4, b"\0"), "big")  # reserved bit included
    return (value % 16) * 2 + 1 if value < 0xE0 else value % 16 * 2


# -- the target ---------------------------------------------------------------------------------


def run(data: bytes, strict: bool = False) -> list[str]:
    """Drive one connection with `data`; AssertionError when an invariant breaks. Returns the
    known findings met (KNOWN_FINDINGS; with `strict` they fail too)."""
    stream = Input(data)
    mode, variant = stream.byte(), stream.byte()
    harness = Harness(variant, strict)
    try:
        if mode & 1:
            structured(harness, stream)
        else:
            raw(harness, stream)
    finally:
        if not harness.lost:
            harness.lose()
    return harness.client.findings


def raw(harness: Harness, data: Input) -> None:
    step = data.byte() | 1
    while data.left() and not harness.core.closing:
        size = step + (data.data[data.pos] if data.left() else 0)
        harness.send(data.take(size))
        harness.answer_all()
        harness.tick(RAW_STEP_S)


def structured(harness: Harness, data: Input) -> None:  # noqa: PLR0912 - a branch per op
    harness.send(HANDSHAKE)
    while data.left() and not harness.lost:
        op = data.byte() % 12
        if op == 0:
            harness.send(data.take(data.u16() % 2048))
        elif op in (1, 2):
            harness.send(headers_frames(harness, data))
        elif op in (3, 4):
            harness.send(data_frame(data))
        elif op == 5:
            harness.send(control_frame(data))
        elif op == 6:
            scale = (0.001, 0.1, 1.0, 30.0)[data.byte() % 4]
            harness.tick(data.byte() * scale)
        elif op in (7, 8):
            harness.answer(data)
        elif op == 9:
            harness.send(b"")
        elif op == 10:
            choice = data.byte() % 8
            if choice == 0:
                harness.core.drain()
            elif choice == 1:
                harness.core.close(data.byte() % 14, "closed by the adapter")
            elif choice == 2:
                harness.lose()
            harness.check([])
        else:
            harness.answer_all()

"""A client for the protocol core's tests: builds frames, well-formed or not, feeds them to a
Connection on a fake clock, and reads back what the core wrote, frame by frame."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import hpack

from ratelimit_sidecar.grpc_server.protocol import events as ev
from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol.connection import Connection
from ratelimit_sidecar.grpc_server.protocol.limits import Counters, Limits
from ratelimit_sidecar.grpc_server.protocol.messages import MessageBudget
from ratelimit_sidecar.grpc_server.protocol.validation import STREAMING, UNARY, UNKNOWN_METHOD

UNARY_PATH = "/test.Service/Unary"
STREAM_PATH = "/test.Service/Stream"
ROUTES = {UNARY_PATH.encode(): UNARY, STREAM_PATH.encode(): STREAMING}
Fields = Sequence[tuple[str, str]]


def route(path: bytes) -> int:
    return ROUTES.get(path, UNKNOWN_METHOD)


def grpc_message(payload: bytes) -> bytes:
    return b"\0" + len(payload).to_bytes(4, "big") + payload


def request_fields(path: str = UNARY_PATH, extra: Fields = ()) -> list[tuple[str, str]]:
    return [
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
        ("te", "trailers"), ("content-type", "application/grpc"), *extra,
    ]  # fmt: skip


@dataclass
class Frame:
    kind: int
    flags: int
    stream_id: int
    payload: bytes
    fields: dict[str, str] = field(default_factory=dict)  # a HEADERS frame's, decoded

    @property
    def error_code(self) -> int:
        """The code of a GOAWAY or RST_STREAM frame."""
        return int(struct.unpack_from("!L", self.payload, 4 if self.kind == f.GOAWAY else 0)[0])

    @property
    def ends_stream(self) -> bool:
        return bool(self.flags & f.END_STREAM)


class Peer:
    """One client connection to a core, the clock at `now`."""

    def __init__(
        self,
        limits: Limits | None = None,
        budget: MessageBudget | None = None,
        handshake: bool = True,
        settings: Sequence[tuple[int, int]] = (),
    ) -> None:
        self.now = 0.0
        self.budget = budget if budget is not None else MessageBudget(64 * 1024 * 1024)
        self.counters = Counters()
        self.core = Connection(limits or Limits(), self.budget, route, self.now, self.counters)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.events: list[ev.Event] = []
        self.server_frames = self.read()  # our SETTINGS and the connection window's growth
        if handshake:
            self.send(f.PREFACE, f.settings_frame(list(settings)), f.frame(f.SETTINGS, f.ACK, 0))
            assert [frame.kind for frame in self.read()] == [f.SETTINGS]  # the ACK of ours

    # -- sending -------------------------------------------------------------------------------

    def send(self, *chunks: bytes, every_turn: bool = True) -> list[ev.Event]:
        """What the core makes of `chunks`; with `every_turn`, the turns a backlog needs too."""
        self.events = self.core.receive(b"".join(chunks), self.now)
        while every_turn and self.core.backlogged and not self.core.closing:
            self.events += self.core.receive(b"", self.now)
        return self.events

    def tick(self, seconds: float) -> list[ev.Event]:
        """The clock moves on; the core's timer fires if it is due."""
        self.now += seconds
        due = self.core.next_timer()
        self.events = self.core.on_timer(self.now) if due is not None and due <= self.now else []
        return self.events

    def block(self, fields: Fields) -> bytes:
        return self.encoder.encode(list(fields))

    def headers(
        self,
        stream_id: int,
        path: str = UNARY_PATH,
        end_stream: bool = False,
        extra: Fields = (),
        fields: Fields | None = None,
    ) -> bytes:
        block = self.block(request_fields(path, extra) if fields is None else fields)
        end = f.END_STREAM if end_stream else 0
        if len(block) <= f.DEFAULT_MAX_FRAME:
            return f.frame(f.HEADERS, f.END_HEADERS | end, stream_id, block)
        parts = [block[i : i + f.DEFAULT_MAX_FRAME] for i in range(0, len(block), 16_384)]
        frames = [f.frame(f.HEADERS, end, stream_id, parts[0])]
        frames += [f.frame(f.CONTINUATION, 0, stream_id, part) for part in parts[1:-1]]
        return b"".join([*frames, f.frame(f.CONTINUATION, f.END_HEADERS, stream_id, parts[-1])])

    @staticmethod
    def data(stream_id: int, payload: bytes, end_stream: bool = True) -> bytes:
        return f.frame(f.DATA, f.END_STREAM if end_stream else 0, stream_id, payload)

    def call(self, stream_id: int, message: bytes = b"hello", path: str = UNARY_PATH) -> bytes:
        """A whole unary call: HEADERS, then one DATA with the message that ends the stream."""
        return self.headers(stream_id, path) + self.data(stream_id, grpc_message(message))

    # -- reading -------------------------------------------------------------------------------

    def read(self) -> list[Frame]:
        out, frames = self.core.data_to_send(), []
        while out:
            length = int.from_bytes(out[:3], "big")
            kind, flags = out[3], out[4]
            stream_id = int.from_bytes(out[5:9], "big") & 0x7FFFFFFF
            frame = Frame(kind, flags, stream_id, out[9 : 9 + length])
            if kind == f.HEADERS:
                frame.fields = {
                    str(name): str(value) for name, value in self.decoder.decode(frame.payload)
                }
            frames.append(frame)
            out = out[9 + length :]
        return frames

    def goaway(self) -> Frame:
        """The GOAWAY the core wrote last; the core is closing."""
        frames = [frame for frame in self.read() if frame.kind == f.GOAWAY]
        assert frames, "no GOAWAY written"
        assert self.core.closing
        return frames[-1]

    def reset_code(self, stream_id: int) -> int:
        """The code of the RST_STREAM the core wrote on `stream_id`."""
        frames = [x for x in self.read() if x.kind == f.RST_STREAM and x.stream_id == stream_id]
        assert frames, f"no RST_STREAM on stream {stream_id}"
        return frames[-1].error_code


def connection_error(peer: Peer, code: int) -> None:
    """The core answered with GOAWAY `code` and is closing, having told its adapter."""
    goaway = peer.goaway()
    assert goaway.error_code == code, (f.error_name(goaway.error_code), goaway.payload[8:])
    assert isinstance(peer.events[-1], ev.ConnectionEnded)
    assert peer.events[-1].code == code


def stream_error(peer: Peer, stream_id: int, code: int) -> None:
    """The core reset `stream_id` with `code` and the connection goes on."""
    assert peer.reset_code(stream_id) == code
    assert not peer.core.closing


def grpc_status(frame: Frame) -> int:
    return int(frame.fields["grpc-status"])

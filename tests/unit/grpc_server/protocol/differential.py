"""The differential test's machinery (test_differential.py): a client script of HTTP/2 frames,
valid and not, rendered to octets; the same octets fed to the protocol core and to python-hyper
`h2` (server side); each side's answer to each frame classified as accepted, a stream error
with its code or a connection error with its code.

A script is a list of frame specs (plain tuples, so hypothesis shrinks them). Stream
identifiers are relative to what the client opened so far (`Ref`): the next new stream, the
newest, an older one, an idle one further on, an even one, one below the newest, stream 0.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Final, NamedTuple

import hpack
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.exceptions import ProtocolError

from ratelimit_sidecar.grpc_server.protocol import events as ev
from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol.connection import Connection
from ratelimit_sidecar.grpc_server.protocol.limits import Limits
from ratelimit_sidecar.grpc_server.protocol.messages import MessageBudget
from ratelimit_sidecar.grpc_server.protocol.validation import UNARY

PATH: Final = b"/test.Service/Unary"
GRPC_REQUEST: Final = (
    (b":method", b"POST"), (b":scheme", b"http"), (b":path", PATH),
    (b":authority", b"localhost"), (b"te", b"trailers"), (b"content-type", b"application/grpc"),
)  # fmt: skip
BAD_PREFACES: Final = (
    b"PRI * HTTP/1.1\r\n\r\nSM\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n",
)


def every_path_unary(path: bytes) -> int:
    return UNARY


# -- the script ---------------------------------------------------------------------------------


class Ref(Enum):
    """Which stream a frame names, relative to the client's streams so far."""

    NEW = "new"  # the newest stream + 2: idle, the valid next one
    NEWEST = "newest"  # the newest stream opened (1 when none)
    OLDER = "older"  # the first stream opened (1 when none)
    SKIP = "skip"  # the newest + 4: idle, skipping one
    EVEN = "even"  # the newest + 1: even, the server's
    LOWER = "lower"  # the newest - 2, or 1: not newer than the newest
    ZERO = "zero"  # the connection


# Mutations of a gRPC request's header block (RFC 9113 §8.2, §8.3), and the valid variants.
HEADER_VARIANTS: Final = (
    "grpc", "grpc", "grpc", "grpc_timeout", "uppercase", "missing_method", "missing_path",
    "missing_scheme", "duplicate_path", "unknown_pseudo", "status_pseudo", "pseudo_after_regular",
    "connection", "transfer_encoding", "te_gzip", "empty_path", "host_mismatch",
    "content_length_0", "content_length_5", "get", "text_plain", "nul_value",
)  # fmt: skip


class Headers(NamedTuple):
    ref: Ref
    variant: str
    end_stream: bool
    end_headers: bool  # False: the block's rest waits for a CONTINUATION
    padding: int  # -1: none; else the pad length (>= the payload: invalid)
    priority: str  # "", "self" or "other"


class Continuation(NamedTuple):
    ref: Ref
    end_headers: bool


class Data(NamedTuple):
    ref: Ref
    shape: str  # "message", "partial", "empty", "compressed", "two"
    size: int
    end_stream: bool
    padding: int  # -1: none; else the pad length (>= the payload: invalid)


class WindowUpdate(NamedTuple):
    ref: Ref
    increment: int
    length: int


class RstStream(NamedTuple):
    ref: Ref
    code: int
    length: int


class Settings(NamedTuple):
    entries: tuple[tuple[int, int], ...]
    ack: bool
    extra: int  # octets added to the payload (a length not a multiple of 6)
    ref: Ref


class Ping(NamedTuple):
    ack: bool
    length: int
    ref: Ref


class Priority(NamedTuple):
    ref: Ref
    depends: str  # "self", "zero" or "other"
    length: int


class GoAway(NamedTuple):
    length: int
    code: int
    ref: Ref


class Unknown(NamedTuple):
    kind: int
    ref: Ref
    length: int


class PushPromise(NamedTuple):
    ref: Ref


Spec = (
    Headers | Continuation | Data | WindowUpdate | RstStream | Settings | Ping | Priority
    | GoAway | Unknown | PushPromise
)  # fmt: skip


class Script(NamedTuple):
    preface: int  # -1: the valid one; else BAD_PREFACES' index
    frames: tuple[Spec, ...]  # after the preface (the first one is usually SETTINGS)


# -- rendering: specs to frames, with what each frame is ---------------------------------------


@dataclass
class Step:
    """One rendered frame and what the comparison needs to know of it."""

    spec: Spec
    octets: bytes
    stream_id: int
    tags: set[str] = field(default_factory=set)

    def __repr__(self) -> str:
        return f"Step({self.spec!r}, stream {self.stream_id}, tags {sorted(self.tags)})"


class Client:
    """Renders specs in order: the streams opened so far, the HPACK encoder, a header block
    left open."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()
        self.newest = 0  # the client's newest stream (HEADERS sent on it)
        self.first = 0
        self.requests: set[int] = set()  # streams whose request HEADERS were sent
        self.with_length: set[int] = set()  # requests that declared a content-length
        self.block_rest = b""  # the rest of a header block opened without END_HEADERS
        self.block_stream = 0
        self.block_tags: set[str] = set()  # its HEADERS' tags, for the CONTINUATION ending it
        self.frames_sent = 0

    def stream(self, ref: Ref) -> int:
        newest = self.newest
        if ref is Ref.NEW:
            return newest + 2 if newest else 1
        if ref is Ref.NEWEST:
            return newest or 1
        if ref is Ref.OLDER:
            return self.first or 1
        if ref is Ref.SKIP:
            return newest + 4 if newest else 3
        if ref is Ref.EVEN:
            return newest + 1 if newest else 2
        if ref is Ref.LOWER:
            return max(newest - 2, 1)
        return 0

    def render(self, spec: Spec) -> Step:
        step = self._render(spec)
        if self.frames_sent == 0:
            step.tags.add("first_frame")
        self.frames_sent += 1
        if self.block_stream and not isinstance(spec, Continuation):
            step.tags.add("interrupts_block")
            if not isinstance(spec, Headers):
                self.block_stream = 0
        return step

    def _render(self, spec: Spec) -> Step:  # noqa: PLR0912 - a branch per frame type
        if isinstance(spec, Headers):
            return self._headers(spec)
        if isinstance(spec, Continuation):
            stream_id = self.block_stream or self.stream(spec.ref)
            flags = f.END_HEADERS if spec.end_headers else 0
            step = Step(spec, f.frame(f.CONTINUATION, flags, stream_id, self.block_rest), stream_id)
            if not self.block_stream:
                step.tags.add("continuation_alone")
            elif spec.end_headers:
                step.tags |= self.block_tags
                self.block_stream, self.block_rest = 0, b""
            return step
        if isinstance(spec, Data):
            return self._data(spec)
        stream_id = self.stream(spec.ref)
        if isinstance(spec, WindowUpdate):
            payload = spec.increment.to_bytes(4, "big")[: spec.length].ljust(spec.length, b"\0")
            return Step(spec, f.frame(f.WINDOW_UPDATE, 0, stream_id, payload), stream_id)
        if isinstance(spec, RstStream):
            payload = spec.code.to_bytes(4, "big")[: spec.length].ljust(spec.length, b"\0")
            return Step(spec, f.frame(f.RST_STREAM, 0, stream_id, payload), stream_id)
        if isinstance(spec, Settings):
            payload = b"".join(struct.pack("!HL", key, value) for key, value in spec.entries)
            payload += bytes(spec.extra)
            flags = f.ACK if spec.ack else 0
            return Step(spec, f.frame(f.SETTINGS, flags, stream_id, payload), stream_id)
        if isinstance(spec, Ping):
            flags = f.ACK if spec.ack else 0
            return Step(spec, f.frame(f.PING, flags, stream_id, bytes(spec.length)), stream_id)
        if isinstance(spec, Priority):
            depends = {"self": stream_id, "zero": 0}.get(spec.depends, stream_id + 2)
            payload = (depends.to_bytes(4, "big") + b"\x10")[: spec.length].ljust(spec.length)
            step = Step(spec, f.frame(f.PRIORITY, 0, stream_id, payload), stream_id)
            if spec.depends == "self":
                step.tags.add("self_dependency")
            return step
        if isinstance(spec, GoAway):
            payload = struct.pack("!LL", self.newest, spec.code) + b"debug"
            payload = payload[: spec.length].ljust(spec.length, b"\0")
            return Step(spec, f.frame(f.GOAWAY, 0, stream_id, payload), stream_id)
        if isinstance(spec, Unknown):
            payload = bytes(spec.length)
            return Step(spec, f.frame(spec.kind, 0xFF, stream_id, payload), stream_id)
        payload = (stream_id + 1).to_bytes(4, "big") + self.encoder.encode(list(GRPC_REQUEST))
        return Step(spec, f.frame(f.PUSH_PROMISE, f.END_HEADERS, stream_id, payload), stream_id)

    def _headers(self, spec: Headers) -> Step:  # noqa: PLR0912 - a branch per option
        stream_id = self.stream(spec.ref)
        step = Step(spec, b"", stream_id)
        if stream_id in self.requests:
            step.tags.add("trailers")
            kind = trailer_kind(spec.variant)
            fields = trailer_fields(kind)
            step.tags.add(f"trailers_{kind}")
        else:
            fields = request_fields(spec.variant)
            step.tags.add(spec.variant)
            if spec.variant.startswith("content_length"):
                self.with_length.add(stream_id)
        if stream_id in self.with_length:
            step.tags.add("content_length")
        if stream_id and stream_id & 1:
            self.requests.add(stream_id)
            if stream_id > self.newest:
                self.newest = stream_id
                self.first = self.first or stream_id
        block = self.encoder.encode(fields)
        flags = f.END_STREAM if spec.end_stream else 0
        if not spec.end_stream:
            step.tags.add("no_end_stream")
        prefix = b""
        if spec.priority:
            depends = stream_id if spec.priority == "self" else stream_id + 2
            prefix = depends.to_bytes(4, "big") + b"\x10"
            flags |= f.PRIORITY_FLAG
            if spec.priority == "self":
                step.tags.add("self_dependency")
        if spec.end_headers:
            flags |= f.END_HEADERS
        else:
            cut = len(block) // 2
            block, self.block_rest, self.block_stream = block[:cut], block[cut:], stream_id
            self.block_tags = step.tags - {"first_frame", "interrupts_block"}
        payload = prefix + block
        if spec.padding >= 0:
            flags |= f.PADDED
            pad = min(spec.padding, 255)
            valid = pad < len(payload) + 1
            payload = bytes((pad,)) + payload + bytes(pad if valid else 0)
            if not valid:
                step.tags.add("bad_padding")
        step.octets = f.frame(f.HEADERS, flags, stream_id, payload)
        return step

    def _data(self, spec: Data) -> Step:
        stream_id = self.stream(spec.ref)
        message = bytes(spec.size)
        payload = {
            "message": b"\0" + len(message).to_bytes(4, "big") + message,
            "partial": b"\0" + (len(message) + 10).to_bytes(4, "big") + message,
            "empty": b"",
            "compressed": b"\1" + len(message).to_bytes(4, "big") + message,
            "two": (b"\0" + len(message).to_bytes(4, "big") + message) * 2,
        }[spec.shape]
        flags = f.END_STREAM if spec.end_stream else 0
        step = Step(spec, b"", stream_id, {spec.shape})
        if stream_id in self.with_length:
            step.tags.add("content_length")
        if spec.padding >= 0:
            flags |= f.PADDED
            pad = min(spec.padding, 255)
            if pad >= len(payload) + 1:
                step.tags.add("bad_padding")
                payload = bytes((pad,)) + payload
            else:
                payload = bytes((pad,)) + payload + bytes(pad)
        step.octets = f.frame(f.DATA, flags, stream_id, payload)
        return step


def trailer_kind(variant: str) -> str:
    """The trailers a request's variant stands for, on a stream whose request was sent."""
    if variant == "uppercase":
        return "uppercase"
    return "pseudo" if "pseudo" in variant or variant.startswith("missing") else "plain"


def trailer_fields(kind: str) -> list[tuple[bytes, bytes]]:
    if kind == "pseudo":
        return [(b":path", b"/x"), (b"x-trailer", b"v")]
    if kind == "uppercase":
        return [(b"X-Trailer", b"v")]
    return [(b"x-trailer", b"v")]


def request_fields(variant: str) -> list[tuple[bytes, bytes]]:
    fields = list(GRPC_REQUEST)
    drop = {"missing_method": b":method", "missing_path": b":path", "missing_scheme": b":scheme"}
    if variant in drop:
        return [field for field in fields if field[0] != drop[variant]]
    add = {
        "grpc_timeout": (b"grpc-timeout", b"5S"),
        "uppercase": (b"X-Upper", b"v"),
        "connection": (b"connection", b"keep-alive"),
        "transfer_encoding": (b"transfer-encoding", b"chunked"),
        "te_gzip": (b"te", b"gzip"),
        "host_mismatch": (b"host", b"elsewhere"),
        "content_length_0": (b"content-length", b"0"),
        "content_length_5": (b"content-length", b"5"),
        "nul_value": (b"x-nul", b"a\0b"),
    }
    if variant in add:
        return [*fields, add[variant]]
    if variant == "duplicate_path":
        return [*fields[:3], (b":path", PATH), *fields[3:]]
    if variant == "unknown_pseudo":
        return [(b":foo", b"bar"), *fields]
    if variant == "status_pseudo":
        return [(b":status", b"200"), *fields]
    if variant == "pseudo_after_regular":
        return [*fields, (b":authority", b"again")]
    if variant == "empty_path":
        return [(name, b"" if name == b":path" else value) for name, value in fields]
    if variant == "get":
        return [(b":method", b"GET"), *fields[1:]]
    if variant == "text_plain":
        return [*fields[:-1], (b"content-type", b"text/plain")]
    return fields


# -- the two servers, and what each made of a frame ---------------------------------------------


class Outcome(NamedTuple):
    """ "accepted", "stream" (error) or "connection" (error), with the error's code."""

    kind: str
    code: int = 0

    def __repr__(self) -> str:
        return self.kind if self.kind == "accepted" else f"{self.kind} {f.error_name(self.code)}"


ACCEPTED: Final = Outcome("accepted")


def stream_error(code: int) -> Outcome:
    return Outcome("stream", code)


def connection_error(code: int) -> Outcome:
    return Outcome("connection", code)


def frames_of(octets: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream, payload) of each frame in `octets`."""
    out, pos = [], 0
    while pos + 9 <= len(octets):
        length = int.from_bytes(octets[pos : pos + 3], "big")
        kind, flags = octets[pos + 3], octets[pos + 4]
        stream_id = int.from_bytes(octets[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        out.append((kind, flags, stream_id, octets[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return out


def resets(frames: Sequence[tuple[int, int, int, bytes]]) -> list[tuple[int, int]]:
    return [
        (stream_id, int.from_bytes(payload[:4], "big"))
        for kind, _, stream_id, payload in frames
        if kind == f.RST_STREAM
    ]


class Core:
    """The protocol core as the server: every unary request answered at once."""

    def __init__(self) -> None:
        self.conn = Connection(Limits(), MessageBudget(1 << 26), every_path_unary, 0.0)
        self.conn.data_to_send()
        self.reset_streams: set[int] = set()  # streams we sent RST_STREAM on

    def feed(self, octets: bytes) -> tuple[Outcome, list[tuple[int, int, int, bytes]]]:
        conn = self.conn
        events = conn.receive(octets, 0.0)
        for event in events:
            if isinstance(event, ev.UnaryRequest):
                conn.answer_unary(event.stream_id, b"answer")
        frames = frames_of(conn.data_to_send())
        for stream_id, _ in resets(frames):
            self.reset_streams.add(stream_id)
        if conn.closing and conn.end_code != f.NO_ERROR:
            return connection_error(conn.end_code), frames
        errors = [code for _, code in resets(frames) if code != f.NO_ERROR]
        return (stream_error(errors[0]) if errors else ACCEPTED), frames


class Hyper:
    """python-hyper's h2 as the server; it answers a stream when the core answers it."""

    def __init__(self) -> None:
        config = H2Configuration(client_side=False, header_encoding=None)
        self.conn = H2Connection(config=config)
        self.conn.initiate_connection()
        self.conn.data_to_send()
        self.dead = False

    def feed(self, octets: bytes) -> Outcome:
        try:
            self.conn.receive_data(octets)
        except ProtocolError as exc:
            self.dead = True
            self.conn.data_to_send()  # its GOAWAY: close_connection's
            return connection_error(int(exc.error_code))
        errors = [code for _, code in resets(frames_of(self.conn.data_to_send())) if code]
        return stream_error(errors[0]) if errors else ACCEPTED

    def mirror(self, core_frames: Sequence[tuple[int, int, int, bytes]]) -> None:
        """What the core sent that ends a stream, sent by h2 too, so that the two agree on
        every stream's state: END_STREAM (the core's answers), RST_STREAM NO_ERROR (§8.1)."""
        conn = self.conn
        for kind, flags, stream_id, payload in core_frames:
            stream = conn.streams.get(stream_id)
            if stream is None or stream.closed:
                continue
            if kind in (f.HEADERS, f.DATA) and flags & f.END_STREAM:
                if not stream.state_machine.headers_sent:
                    conn.send_headers(stream_id, [(b":status", b"200")], end_stream=True)
                else:
                    conn.end_stream(stream_id)
            elif kind == f.RST_STREAM and not int.from_bytes(payload[:4], "big"):
                conn.reset_stream(stream_id, 0)
        conn.data_to_send()

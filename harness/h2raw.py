"""A raw HTTP/2 client on a blocking socket, for the transport's conformance and abuse tests:
it writes whatever frames a test builds, well-formed or not, and reads frames back one by one."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import hpack

from harness import h2frames as f
from ratelimit_sidecar._proto import wire


@dataclass(frozen=True)
class Frame:
    kind: int
    flags: int
    stream_id: int
    payload: bytes

    @property
    def error_code(self) -> int:
        """The code of a GOAWAY or RST_STREAM frame."""
        offset = 4 if self.kind == f.GOAWAY else 0
        return int(struct.unpack_from("!L", self.payload, offset)[0])


def grpc_message(payload: bytes) -> bytes:
    return b"\0" + len(payload).to_bytes(4, "big") + payload


class RawH2:
    """One connection to 127.0.0.1:`port`; `preface` sends the preface and an empty SETTINGS."""

    def __init__(self, port: int, *, preface: bool = True, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.pending = bytearray()
        self.pos = (
            0  # where the next frame starts in `pending`: frames are not copied out one by one
        )
        if preface:  # and room for many answers, as real clients give; our SETTINGS ACKed
            self.send(f.PREFACE + f.settings({}) + f.window_update(0, 1 << 24) + f.settings_ack())

    def close(self) -> None:
        self.sock.close()

    def send(self, *data: bytes) -> None:
        self.sock.sendall(b"".join(data))

    def headers(
        self,
        stream_id: int,
        path: str = wire.METHOD_PATH,
        *,
        end_stream: bool = False,
        extra: tuple[tuple[str, str], ...] = (),
    ) -> bytes:
        """A request HEADERS frame for `path`, with gRPC's headers and `extra`."""
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path)]
        fields += [(":authority", "sidecar"), ("content-type", "application/grpc")]
        fields += [("te", "trailers"), *extra]
        block = self.encoder.encode(fields)
        pieces = [block[i : i + f.DEFAULT_FRAME_SIZE] for i in range(0, len(block), 16_384)]
        last = len(pieces) - 1
        return b"".join(
            f.frame(
                f.CONTINUATION if i else f.HEADERS,
                (f.END_HEADERS if i == last else 0) | (f.END_STREAM if end_stream and not i else 0),
                stream_id,
                piece,
            )
            for i, piece in enumerate(pieces)
        )

    @staticmethod
    def data(stream_id: int, payload: bytes, *, end_stream: bool = True) -> bytes:
        return f.frame(f.DATA, f.END_STREAM if end_stream else 0, stream_id, payload)

    def call(self, stream_id: int, message: bytes, path: str = wire.METHOD_PATH) -> bytes:
        """HEADERS and one DATA frame carrying `message`, ending the request."""
        return self.headers(stream_id, path) + self.data(stream_id, grpc_message(message))

    def read_frame(self, timeout_s: float = 10.0) -> Frame | None:
        """The next frame, or None when the server closed the connection."""
        self.sock.settimeout(timeout_s)
        while (frame := self.buffered()) is None:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self.feed(chunk)
        return frame

    def feed(self, chunk: bytes) -> None:
        """Bytes received on the socket by the caller (one polling many connections)."""
        if self.pos:
            del self.pending[: self.pos]
            self.pos = 0
        self.pending += chunk

    def buffered(self) -> Frame | None:
        """The next complete frame among the bytes received, if there is one."""
        pending, pos = self.pending, self.pos
        if len(pending) - pos < 9:
            return None
        high, low, kind, flags, stream_id = f.FRAME_HEADER.unpack_from(pending, pos)
        end = pos + 9 + (high << 16 | low)
        if len(pending) < end:
            return None
        self.pos = end
        return Frame(kind, flags, stream_id & 0x7FFFFFFF, bytes(pending[pos + 9 : end]))

    def advertised(self, timeout_s: float = 10.0) -> dict[int, int]:
        """The server's SETTINGS (its first frame); what follows it stays to be read."""
        for frame in self.frames_until(f.SETTINGS, 0, timeout_s):
            if frame.kind == f.SETTINGS and not frame.flags & f.ACK:
                return f.parse_settings(frame.payload)
        raise ConnectionError("the server closed the connection before its SETTINGS")

    def frames_until(self, kind: int, stream_id: int = 0, timeout_s: float = 10.0) -> list[Frame]:
        """Frames read up to and including the first of `kind` on `stream_id` (any stream for
        GOAWAY), or up to the connection's end."""
        deadline = time.monotonic() + timeout_s
        seen: list[Frame] = []
        while (left := deadline - time.monotonic()) > 0:
            frame = self.read_frame(left)
            if frame is None:
                return seen
            seen.append(frame)
            if frame.kind == kind and (kind == f.GOAWAY or frame.stream_id == stream_id):
                return seen
        raise TimeoutError(f"no frame of type {kind} on stream {stream_id} in {timeout_s} s")

    def goaway(self, timeout_s: float = 10.0) -> Frame | None:
        frames = self.frames_until(f.GOAWAY, timeout_s=timeout_s)
        return frames[-1] if frames and frames[-1].kind == f.GOAWAY else None

    def response(self, stream_id: int, timeout_s: float = 10.0) -> Response:
        """The stream's response, read until its END_STREAM or RST_STREAM."""
        return self.responses([stream_id], timeout_s)[stream_id]

    def responses(self, stream_ids: list[int], timeout_s: float = 10.0) -> dict[int, Response]:
        """The responses of `stream_ids`, read until each ended (frames of others dropped)."""
        found = {stream_id: Response() for stream_id in stream_ids}
        open_streams = set(stream_ids)
        deadline = time.monotonic() + timeout_s
        while open_streams:
            frame = self.read_frame(max(0.0, deadline - time.monotonic()))
            if frame is None:
                raise ConnectionError("the server closed the connection")
            response = found.get(frame.stream_id)
            if frame.kind == f.HEADERS:
                fields = list(self.decoder.decode(frame.payload))  # keeps the table in step
                if response is not None:
                    response.add_headers(fields, frame.flags)
            elif response is not None and frame.kind in (f.DATA, f.RST_STREAM):
                response.add(frame)
            if response is not None and response.ended:
                open_streams.discard(frame.stream_id)
        return found


class Response:
    """What one stream received: headers, trailers, body, or the code of its reset."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.trailers: dict[str, str] = {}
        self.body = b""
        self.reset: int | None = None
        self.ended = False

    def add_headers(self, fields: list[Any], flags: int) -> None:
        (self.trailers if self.headers else self.headers).update(dict(fields))
        self.ended = bool(flags & f.END_STREAM)

    def add(self, frame: Frame) -> None:
        if frame.kind == f.RST_STREAM:
            self.reset, self.ended = frame.error_code, True
        else:
            self.body += frame.payload
            self.ended = bool(frame.flags & f.END_STREAM)

    @property
    def status(self) -> int | None:
        """grpc-status, from the trailers or a trailers-only response."""
        value = self.trailers.get("grpc-status") or self.headers.get("grpc-status")
        return None if value is None else int(value)

    @property
    def message(self) -> str:
        return self.trailers.get("grpc-message") or self.headers.get("grpc-message", "")


STATUS_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


@dataclass(frozen=True)
class End:
    """How the server ended one stream: a grpc-status (trailers) or RST_STREAM's code; when, in
    seconds since the Tally that saw it began."""

    stream_id: int
    status: int | None
    reset: int | None
    after_s: float

    def __str__(self) -> str:
        if self.reset is not None:
            return f"RST_STREAM {f.code_name(self.reset)}"
        if self.status is None:
            return "ended without grpc-status"
        return f"grpc-status {STATUS_NAMES.get(self.status, str(self.status))}"


class Tally:
    """What one connection got back, frame by frame: how each stream ended (the first end), the
    server's GOAWAY, the payloads of PING ACKs, SETTINGS ACKs; HPACK kept in step. Response
    bodies are not kept: an attack's answers can be many."""

    def __init__(self, raw: RawH2) -> None:
        self.raw, self.started = raw, time.monotonic()
        self.responses: dict[int, Response] = {}
        self.ends: dict[int, End] = {}
        self.goaway: Frame | None = None
        self.pings: list[bytes] = []
        self.settings_acks = 0
        self.closed = False

    def take(self, frame: Frame) -> None:
        kind, acked = frame.kind, bool(frame.flags & f.ACK)
        if kind == f.HEADERS:
            fields = list(self.raw.decoder.decode(frame.payload))
            self._response(frame.stream_id).add_headers(fields, frame.flags)
        elif kind == f.RST_STREAM or (kind == f.DATA and frame.flags & f.END_STREAM):
            self._response(frame.stream_id).add(frame)
        elif kind == f.GOAWAY:
            self.goaway = self.goaway or frame
        elif kind == f.PING and acked:
            self.pings.append(frame.payload)
        elif kind == f.SETTINGS and acked:
            self.settings_acks += 1
        self._note_end(frame.stream_id)

    def _response(self, stream_id: int) -> Response:
        return self.responses.setdefault(stream_id, Response())

    def _note_end(self, stream_id: int) -> None:
        response = self.responses.get(stream_id)
        if response is None or not response.ended or stream_id in self.ends:
            return
        after = time.monotonic() - self.started
        self.ends[stream_id] = End(stream_id, response.status, response.reset, after)

    def until(self, done: Callable[[Tally], bool], timeout_s: float) -> bool:
        """Read until `done(self)`, the connection's end or `timeout_s` passed: whether done."""
        deadline = time.monotonic() + timeout_s
        while not done(self):
            left = deadline - time.monotonic()
            if self.closed or left <= 0:
                return False
            try:
                frame = self.raw.read_frame(left)
            except TimeoutError:
                return False
            except OSError:
                frame = None
            self.closed = frame is None
            if frame is not None:
                self.take(frame)
        return True

    def ended_goaway(self) -> int | None:
        """The code of the server's GOAWAY, if it sent one."""
        return None if self.goaway is None else self.goaway.error_code

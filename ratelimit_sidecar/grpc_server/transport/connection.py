"""One HTTP/2 connection: the frame loop, flow control, and the limits that keep abuse cheap.

The loop parses the complete frames of a read, answers what it can at once (a ShouldRateLimit
call is decided inline) and writes all answers of the read in one `write`. Each limit and the
RFC 9113 answer it gives (GOAWAY or RST_STREAM with its code) is listed in docs/TRANSPORT.md:
frame and header block sizes, a flood budget for frames that ask work without a request (PING,
SETTINGS, rapid reset), concurrent streams, and a peer that does not read (the connection
stops being read until its answers drain).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol, cast

from ratelimit_sidecar.grpc_server.transport import frames as f
from ratelimit_sidecar.grpc_server.transport.aging import Aging
from ratelimit_sidecar.grpc_server.transport.control import ControlFrames, Stream
from ratelimit_sidecar.grpc_server.transport.frames import ConnectionError_, ErrorCode
from ratelimit_sidecar.grpc_server.transport.headers import BlockDecoder, Decoded

log = logging.getLogger("ratelimit_sidecar.transport")

MAX_CONCURRENT_STREAMS = 1024
SOFT_HEADER_LIST_BYTES = 16 * 1024  # the advertised limit; over it, the call is refused
HARD_HEADER_BYTES = 64 * 1024  # over it, encoded or decoded, the connection ends
CONNECTION_WINDOW = 16 * 1024 * 1024
FLOOD_BUDGET = 2_000  # frames that ask work without a request, per FLOOD_WINDOW_S
FRAMES_PER_TURN = 256
FLOOD_WINDOW_S = 10.0
WRITE_HIGH_WATER = 256 * 1024
HANDSHAKE_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 5.0  # a closing connection whose peer does not read is aborted after this
SERVER_SETTINGS = f.settings({
    f.SETTINGS_MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
    f.SETTINGS_MAX_HEADER_LIST_SIZE: SOFT_HEADER_LIST_BYTES, f.SETTINGS_ENABLE_PUSH: 0,
}) + f.window_update(0, CONNECTION_WINDOW - f.DEFAULT_WINDOW)  # fmt: skip


class CallOpener(Protocol):
    """Where a connection's calls start (ServerCore, grpc_server/transport/server.py)."""

    connections: set[H2Connection]
    max_age: tuple[float, float] | None  # seconds a connection lives, then grace for its calls

    def open_call(
        self, conn: H2Connection, stream_id: int, decoded: Decoded, end: bool
    ) -> None: ...


class H2Connection(ControlFrames, asyncio.Protocol):
    """The server side of one HTTP/2 connection carrying gRPC calls."""

    def __init__(self, core: CallOpener) -> None:
        self.core = core
        self.transport: asyncio.Transport | None = None
        self.decoder = BlockDecoder(HARD_HEADER_BYTES)
        self.buffer = bytearray()
        self.out: list[bytes] = []
        self.calls: dict[int, Stream] = {}
        self.last_stream_id = 0
        self.preface_seen = False
        self.block_stream = 0  # a header block continues in CONTINUATION frames on this stream
        self.block = bytearray()
        self.block_end_stream = False
        self.send_window = f.DEFAULT_WINDOW
        self.peer_initial_window = f.DEFAULT_WINDOW
        self.peer_max_frame = f.DEFAULT_FRAME_SIZE
        self.recv_window = CONNECTION_WINDOW
        self.recv_unacked = 0
        self.budget = FLOOD_BUDGET
        self.budget_since = asyncio.get_running_loop().time()
        self.blocked: dict[int, Stream] = {}  # calls waiting for send window
        self.fresh: list[Stream] = []  # calls with a deadline opened in this read
        self.draining = False
        self.closed = False
        self.reading_paused = False  # by the write side (a slow reader)
        self.yielding = False  # reading paused until the buffered frames are handled
        self._turn: asyncio.Handle | None = None
        self.peer = ""
        self._timer: asyncio.TimerHandle | None = None
        self._aging: Aging | None = None  # --grpc-max-connection-age-s
        self._dispatch: tuple[Callable[[int, int, bytes], None], ...] = (
            self._on_data, self._on_headers, self._on_priority, self._on_rst_stream,
            self._on_settings, self._on_push_promise, self._on_ping, self._on_goaway,
            self._on_window_update, self._on_continuation,
        )  # fmt: skip

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is one without subclassing
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        transport.write(SERVER_SETTINGS)
        self._timer = asyncio.get_running_loop().call_later(
            HANDSHAKE_TIMEOUT_S, self._handshake_expired
        )
        self.core.connections.add(self)
        self._aging = None if self.core.max_age is None else Aging(self, *self.core.max_age)

    def connection_lost(self, _exc: Exception | None) -> None:
        self.closed = True
        if self._turn is not None:
            self._turn.cancel()
        if self._timer is not None:
            self._timer.cancel()
        if self._aging is not None:
            self._aging.cancel()
        for call in list(self.calls.values()):
            call.cancel()
        self.calls.clear()
        self.blocked.clear()
        self.core.connections.discard(self)

    def pause_writing(self) -> None:
        """The peer reads slower than we answer: stop taking its requests until it catches up."""
        if self.transport is not None and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closed and self.reading_paused:
            self.reading_paused = False
            if not self.yielding:
                self.transport.resume_reading()

    def eof_received(self) -> bool:
        """The peer closed its side: answer the calls it sent, then close."""
        self.draining = True
        self.close_if_idle()
        return True

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.buffer += data
        if self._turn is None:  # else a turn is due: it reads this too
            self._work()

    def _work(self) -> None:
        """Handle up to FRAMES_PER_TURN frames; with more left, let other connections have
        the loop first (reading paused meanwhile): one flood cannot hold it for long."""
        self._turn, more = None, False
        try:
            if self.preface_seen or self._read_preface():
                more = self._read_frames()
        except ConnectionError_ as exc:
            self.fail(exc.code, str(exc))
        if self.fresh:  # a deadline needs a timer only if its call was not answered at once
            for call in self.fresh:
                call.arm_deadline()
            self.fresh.clear()
        self.flush()
        if more and not self.closed and self.transport is not None:
            if not self.yielding:
                self.yielding = True
                self.transport.pause_reading()
            self._turn = asyncio.get_running_loop().call_soon(self._work)
        elif self.yielding and not self.closed and self.transport is not None:
            self.yielding = False
            if not self.reading_paused:
                self.transport.resume_reading()

    def _read_preface(self) -> bool:
        seen = bytes(self.buffer[: len(f.PREFACE)])
        if not f.PREFACE.startswith(seen):
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
        if len(seen) < len(f.PREFACE):
            return False
        del self.buffer[: len(f.PREFACE)]
        self.preface_seen = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return True

    def _read_frames(self) -> bool:
        """The complete frames of the buffer, FRAMES_PER_TURN at most; True if more are left."""
        buffer, unpack, dispatch = self.buffer, f.FRAME_HEADER.unpack_from, self._dispatch
        pos, size, turn = 0, len(buffer), FRAMES_PER_TURN
        try:
            while size - pos >= 9 and not self.closed:
                turn -= 1
                if turn < 0:
                    return True
                high, low, kind, flags, stream_id = unpack(buffer, pos)
                length = high << 16 | low
                if length > f.DEFAULT_FRAME_SIZE:
                    raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, f"frame of {length} bytes")
                end = pos + 9 + length
                if end > size:
                    break
                payload = bytes(buffer[pos + 9 : end])
                pos = end
                stream_id &= 0x7FFFFFFF
                if self.block_stream and kind != f.CONTINUATION:
                    raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "header block interrupted")
                if kind < 10:
                    dispatch[kind](flags, stream_id, payload)
                else:  # unknown frame types are ignored (RFC 9113 §4.1), at a cost
                    self.spend(1)
        finally:
            del buffer[:pos]
        return False

    def spend(self, cost: int) -> None:
        self.budget -= cost
        if self.budget < 0:  # a budget older than FLOOD_WINDOW_S starts again: keepalives pass
            now = asyncio.get_running_loop().time()
            if now - self.budget_since < FLOOD_WINDOW_S:
                raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, "too many frames, no requests")
            self.budget, self.budget_since = FLOOD_BUDGET - cost, now

    def refill(self) -> None:
        if self.budget < FLOOD_BUDGET:
            self.budget += 1

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self.recv_window -= size
        if self.recv_window < 0:
            raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "connection window overrun")
        data = f.unpad(payload) if flags & f.PADDED else payload
        if not data and not flags & f.END_STREAM:
            self.spend(1)
        call = self.calls.get(stream_id)
        if call is None:
            if stream_id > self.last_stream_id:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "DATA on an idle stream")
            self.consumed(size)  # a stream we ended: its data is dropped
            return
        self.consumed(size - len(data))
        call.receive(data, size, flags & f.END_STREAM != 0)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0 or stream_id % 2 == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}")
        block = f.unpad(payload) if flags & f.PADDED else payload
        if flags & f.PRIORITY_FLAG:
            block = block[5:]
        self.block_end_stream = flags & f.END_STREAM != 0
        if flags & f.END_HEADERS:
            self._header_block(stream_id, block)
        else:
            self.block_stream = stream_id
            self.block[:] = block

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != self.block_stream or stream_id == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        if not payload:
            self.spend(1)
        self.block += payload
        if len(self.block) > HARD_HEADER_BYTES:
            raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, "header block too large")
        if flags & f.END_HEADERS:
            self.block_stream = 0
            block = bytes(self.block)
            self.block.clear()
            self._header_block(stream_id, block)

    def _header_block(self, stream_id: int, block: bytes) -> None:
        decoded = self.decoder.decode(block)
        end_stream = self.block_end_stream
        call = self.calls.get(stream_id)
        if call is not None:  # trailers from the client end its side
            if not end_stream:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "trailers without END_STREAM")
            call.receive(b"", 0, True)
            return
        if stream_id <= self.last_stream_id:
            raise ConnectionError_(ErrorCode.STREAM_CLOSED, f"HEADERS on closed stream {stream_id}")
        self.last_stream_id = stream_id
        if self.draining or len(self.calls) >= MAX_CONCURRENT_STREAMS:
            self.spend(1)
            self.out.append(f.rst_stream(stream_id, ErrorCode.REFUSED_STREAM))
            return
        self.core.open_call(self, stream_id, decoded, end_stream)

    def consumed(self, size: int) -> None:
        """`size` bytes of request data were used up: hand them back to the peer's window."""
        self.recv_window += size
        self.recv_unacked += size
        if self.recv_unacked >= CONNECTION_WINDOW // 4:
            self.out.append(f.window_update(0, self.recv_unacked))
            self.recv_unacked = 0

    def flush(self) -> None:
        if self.out and self.transport is not None and not self.closed:
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def unblock(self) -> None:
        for stream_id, call in list(self.blocked.items()):
            if self.send_window <= 0:
                return
            del self.blocked[stream_id]
            call.pump()

    def ended(self, call: Stream) -> None:
        """`call` sent its trailers: forget it; a peer still sending is told to stop."""
        self.calls.pop(call.stream_id, None)
        self.blocked.pop(call.stream_id, None)
        if not call.remote_closed:
            self.out.append(f.rst_stream(call.stream_id, ErrorCode.NO_ERROR))
        self.refill()
        self.close_if_idle()

    def goaway(self) -> None:
        """Graceful drain: no new streams; close once the open ones are answered."""
        if self.closed:
            return
        self.draining = True
        self.out.append(f.goaway(self.last_stream_id, ErrorCode.NO_ERROR))
        self.flush()
        self.close_if_idle()

    def fail(self, code: ErrorCode, reason: str) -> None:
        """A connection error: GOAWAY with `code`, then close."""
        if self.closed:
            return
        log.info("HTTP/2 connection from %s ended: %s (%s)", self.peer, reason, code.name)
        self.out.append(f.goaway(self.last_stream_id, code, reason))
        self.flush()
        self.close()

    def close(self) -> None:
        if self.transport is None or self.closed:
            return
        self.closed = True
        for call in list(self.calls.values()):
            call.cancel()
        self.transport.close()  # sends what is buffered first; a peer that never reads...
        transport = self.transport
        asyncio.get_running_loop().call_later(CLOSE_TIMEOUT_S, transport.abort)  # ...is cut

    def close_if_idle(self) -> None:
        if self.draining and not self.calls:
            self.flush()
            self.close()

    def _handshake_expired(self) -> None:
        self._timer = None
        if not self.preface_seen:
            self.fail(ErrorCode.PROTOCOL_ERROR, "no connection preface in time")

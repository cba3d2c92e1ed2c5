"""What a connection writes, and the send side of flow control (RFC 9113 §5.2, §6.9).

DATA is the only flow-controlled frame: a response's DATA goes out as far as both the
connection's send window and the stream's allow, cut to the client's SETTINGS_MAX_FRAME_SIZE;
the rest waits on the stream until WINDOW_UPDATE (or a larger SETTINGS_INITIAL_WINDOW_SIZE)
opens a window. A stream's window may be negative after the client lowers its initial window
(§6.9.2); it then sends nothing until credited. Trailers follow the last DATA octet.

Output decides no state: it says which responses were completed (trailers written), so the
connection moves those streams on.
"""

from __future__ import annotations

from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol.responses import unary_answer
from ratelimit_sidecar.grpc_server.protocol.stream import Stream

_TRAILER_FLAGS = f.END_HEADERS | f.END_STREAM


class Output:
    """The frames to write (`chunks`) and the windows that hold responses back."""

    __slots__ = (
        "blocked", "chunks", "initial_window", "max_frame", "uncredited", "uncredited_streams",
        "window",
    )  # fmt: skip

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.window = f.DEFAULT_WINDOW  # the connection's send window
        # DATA octets sent and not yet credited back by the client, on the connection and on
        # its streams (all together): a WINDOW_UPDATE within them pays for what we sent.
        self.uncredited = self.uncredited_streams = 0
        self.initial_window = f.DEFAULT_WINDOW  # the client's SETTINGS_INITIAL_WINDOW_SIZE
        self.max_frame = f.DEFAULT_MAX_FRAME  # the client's SETTINGS_MAX_FRAME_SIZE
        self.blocked: dict[int, Stream] = {}  # streams with octets waiting for window

    def take(self) -> bytes:
        out = b"".join(self.chunks)
        self.chunks.clear()
        return out

    def unary(self, stream: Stream, message: bytes) -> bool:
        """A whole unary answer in one write, if the windows let it all through at once."""
        size = len(message) + 5
        if size > self.window or size > stream.send_window or size > self.max_frame:
            return False
        self.window -= size
        stream.send_window -= size
        self.uncredited += size
        self.uncredited_streams += size
        self.chunks.append(unary_answer(stream.stream_id, message))
        return True

    def send(self, stream: Stream) -> bool:
        """What `stream` has queued, as far as the windows allow, then its trailers (or, when
        they are b"", END_STREAM on the last DATA); True once the stream's END_STREAM is
        written."""
        ends_with_data = stream.trailers == b""
        if stream.pending:
            sent = stream.pump(self.window, self.max_frame, self.chunks, ends_with_data)
            self.window -= sent
            self.uncredited += sent
            self.uncredited_streams += sent
            if stream.pending:  # to the back of the queue: blocked streams take turns
                self.blocked.pop(stream.stream_id, None)
                self.blocked[stream.stream_id] = stream
                return False
        elif ends_with_data:
            self.chunks.append(f.frame(f.DATA, f.END_STREAM, stream.stream_id))
        self.blocked.pop(stream.stream_id, None)
        if stream.trailers is None:
            return False
        if stream.trailers:
            chunk = f.frame(f.HEADERS, _TRAILER_FLAGS, stream.stream_id, stream.trailers)
            self.chunks.append(chunk)
        return True

    def unblock(self, only: Stream | None = None) -> list[Stream]:
        """After a window grew (the connection's, or `only` that stream's): the blocked streams
        that sent all they had queued."""
        drained = []
        for stream in list(self.blocked.values()) if only is None else [only]:
            if self.window <= 0:
                break
            if stream.send_window > 0:
                self.send(stream)
                if stream.stream_id not in self.blocked:
                    drained.append(stream)
        return drained

    def drop(self, stream: Stream) -> None:
        """The stream is over: what it had queued is not sent."""
        stream.pending = None
        self.blocked.pop(stream.stream_id, None)

    def credits_sent(self, stream_id: int, increment: int) -> bool:
        """Whether a WINDOW_UPDATE gives back no more than we sent since the last ones (what
        every client does as it reads our answers); counted off if so."""
        if stream_id == 0 and increment <= self.uncredited:
            self.uncredited -= increment
            return True
        if stream_id and increment <= self.uncredited_streams:
            self.uncredited_streams -= increment
            return True
        return False

    def connection_window_update(self, increment: int) -> None:
        self.window += increment
        if self.window > f.MAX_WINDOW:
            raise f.ConnectionFault(f.FLOW_CONTROL_ERROR, "the connection's window over 2^31-1")

    def initial_window_changed(self, streams: list[Stream], peak: int, final: int) -> None:
        """SETTINGS_INITIAL_WINDOW_SIZE values `peak` (the largest of one frame's) and `final`
        (its last): every stream's window moves by the change, once per frame. A window pushed
        over 2^31-1 on the way is a connection error FLOW_CONTROL_ERROR (§6.9.2)."""
        for stream in streams:
            if stream.send_window + peak - self.initial_window > f.MAX_WINDOW:
                text = f"SETTINGS_INITIAL_WINDOW_SIZE overflows stream {stream.stream_id}'s window"
                raise f.ConnectionFault(f.FLOW_CONTROL_ERROR, text)
            stream.send_window += final - self.initial_window
        self.initial_window = final

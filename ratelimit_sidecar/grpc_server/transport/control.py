"""The control frames of an HTTP/2 connection (RFC 9113 §6): settings, pings, resets,
window updates, GOAWAY; PRIORITY is read and ignored, PUSH_PROMISE refused."""

from __future__ import annotations

import struct
from typing import Protocol

from ratelimit_sidecar.grpc_server.transport import frames as f
from ratelimit_sidecar.grpc_server.transport.frames import ConnectionError_, ErrorCode


class Stream(Protocol):
    """What the connection needs of one call (grpc_server/transport/calls.py)."""

    stream_id: int
    send_window: int
    remote_closed: bool

    def receive(self, data: bytes, flow_size: int, end: bool) -> None: ...

    def window_update(self, increment: int) -> None: ...

    def pump(self) -> None: ...

    def cancel(self) -> None: ...

    def arm_deadline(self) -> None: ...


class ControlFrames:
    """The connection's state these frames read and change; H2Connection has the rest."""

    calls: dict[int, Stream]
    blocked: dict[int, Stream]
    out: list[bytes]
    last_stream_id: int
    send_window: int
    peer_initial_window: int
    peer_max_frame: int
    draining: bool

    def spend(self, cost: int) -> None:
        raise NotImplementedError

    def close_if_idle(self) -> None:
        raise NotImplementedError

    def unblock(self) -> None:
        raise NotImplementedError

    def _on_priority(self, _flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 5 or stream_id == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "bad PRIORITY frame")
        self.spend(1)

    def _on_rst_stream(self, _flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4 or stream_id == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "bad RST_STREAM frame")
        if stream_id > self.last_stream_id:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        self.spend(1)
        call = self.calls.pop(stream_id, None)
        self.blocked.pop(stream_id, None)
        if call is not None:
            call.cancel()
            self.close_if_idle()

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            if payload:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS of a bad length")
        self.spend(1)
        for offset in range(0, len(payload), 6):
            key, value = struct.unpack_from("!HL", payload, offset)
            self._setting(key, value)
        self.out.append(f.frame(f.SETTINGS, f.ACK, 0))
        self.unblock()

    def _setting(self, key: int, value: int) -> None:
        if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
            if value > f.MAX_WINDOW:
                raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "initial window too large")
            delta, self.peer_initial_window = value - self.peer_initial_window, value
            for call in self.calls.values():
                call.send_window += delta
        elif key == f.SETTINGS_MAX_FRAME_SIZE:
            if not f.DEFAULT_FRAME_SIZE <= value <= f.MAX_FRAME_SIZE_LIMIT:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
            self.peer_max_frame = value
        elif key == f.SETTINGS_ENABLE_PUSH and value > 1:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "bad SETTINGS_ENABLE_PUSH")

    def _on_push_promise(self, _flags: int, _stream_id: int, _payload: bytes) -> None:
        raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")

    def _on_ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 8:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "PING of a bad length")
        if stream_id != 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
        if not flags & f.ACK:
            self.spend(1)
            self.out.append(f.frame(f.PING, f.ACK, 0, payload))

    def _on_goaway(self, _flags: int, stream_id: int, _payload: bytes) -> None:
        if stream_id != 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
        self.draining = True  # the peer opens no more streams: close once ours are answered
        self.close_if_idle()

    def _on_window_update(self, _flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE of a bad length")
        increment = struct.unpack("!L", payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > f.MAX_WINDOW:
                raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "connection window overflow")
            self.unblock()
            return
        call = self.calls.get(stream_id)
        if call is not None:
            call.window_update(increment)

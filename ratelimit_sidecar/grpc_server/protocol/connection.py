"""The protocol core of the gRPC port: one server connection's HTTP/2 (RFC 9113) and the gRPC
calls over it, without I/O; its state machine is one class. An adapter drives one per transport:

- `receive(data, now)` with what was read: returns the events (events.py) in wire order. When
  `backlogged` is set after it, the turn stopped after `frames_per_turn` frames with complete
  frames left: the adapter lets other connections run, then calls `receive(b"", now)`.
- `data_to_send()` after every call: what to write; `next_timer()`: when `on_timer(now)` is due.
- the answers: `answer_unary`, or `send_headers`, `send_message`, `end_call`; `reset`;
  `message_consumed` for each Message a streaming handler takes; `drain` for a graceful
  GOAWAY; `close` for a connection error; `connection_lost` when the transport dies.
- `closing`: once set, write `data_to_send()` and close the transport. Events come only from
  `receive` and `on_timer`: a close an answer causes (a drain's last call) shows here alone.

Which frame a stream accepts is states.py's table; this class does the rest of §3-§6: the
preface (§3.4: the client's first frame is SETTINGS), SETTINGS and ACK (§6.5), header blocks
(§4.3, §6.10: headers.BlockAssembler), stream identifiers (§5.1.1), concurrency (§5.1.2:
REFUSED_STREAM), priority (§5.3.1: a self-dependency is a stream error PROTOCOL_ERROR, the rest
ignored as §5.3.2 allows), flow control both ways (§5.2, §6.9; output.py sends), PING (§6.7),
GOAWAY (§6.8), frame sizes (§4.2), limits.py's bounds. A connection error is GOAWAY with its
code, then `closing`; a stream error, RST_STREAM with its code.

A unary call (validation.py: by the adapter's `Route`) yields one UnaryRequest once its request
ended; a streaming call yields RequestStarted at once, then Message, then RequestEnded.

Time limits end a call with trailers DEADLINE_EXCEEDED (then RST_STREAM NO_ERROR if the client
still sends: RFC 9113 §8.1), not CANCELLED: a time limit ran out, and CANCELLED tells a gRPC
client that someone cancelled the call, which nobody did. grpc-message says which limit:
- `grpc-timeout`, the client's deadline.
- `unary_receive_timeout_s` (10 s): a unary request not whole that long after its HEADERS (a
  healthy client sends it at once; a stalled one loses its stream slot and buffered message).
- `stream_idle_timeout_s` (300 s): a streaming call whose client sent no message that long.
  Envoy's RLQS client reports usage every `reporting_interval` (typically 5 to 60 s), so 300 s
  is several missed reports; a stream the client half-closed (health Watch) never idles out.
"""

from __future__ import annotations

from typing import Final

from ratelimit_sidecar.grpc_server.protocol import events as ev
from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol import states as s
from ratelimit_sidecar.grpc_server.protocol import validation as v
from ratelimit_sidecar.grpc_server.protocol.headers import BlockAssembler, HeaderBlocks
from ratelimit_sidecar.grpc_server.protocol.limits import ControlBudget, Counters, Limits
from ratelimit_sidecar.grpc_server.protocol.messages import (
    PREFIX,
    MessageBudget,
    MessageFault,
    whole_message,
)
from ratelimit_sidecar.grpc_server.protocol.output import Output
from ratelimit_sidecar.grpc_server.protocol.responses import (
    GRPC_OK_TRAILERS,
    GRPC_RESPONSE_HEADERS,
    grpc_status_block,
)
from ratelimit_sidecar.grpc_server.protocol.stream import NEVER, Stream
from ratelimit_sidecar.grpc_server.protocol.timers import StreamTimers
from ratelimit_sidecar.grpc_server.protocol.validation import STREAMING, UNARY, RequestHead

GRPC_DEADLINE_EXCEEDED: Final = 4
BUDGET_RETRY_S: Final = 0.05  # a stream whose credit waits for the message budget
_END_OF_BLOCK: Final = f.END_HEADERS | f.END_STREAM


class Connection:
    """One connection's protocol state; `budget` and `counters` may be shared by many."""

    def __init__(
        self, limits: Limits, budget: MessageBudget, route: v.Route, now: float,
        counters: Counters | None = None,
    ) -> None:  # fmt: skip
        counters = counters if counters is not None else Counters()
        self.limits, self.budget, self.now, self.counters = limits, budget, now, counters
        self.max_message = limits.max_message_bytes
        self.blocks = HeaderBlocks(
            route, limits.max_header_list_bytes, limits.hard_header_bytes, counters
        )
        self.assembler = BlockAssembler(limits.hard_header_bytes, counters)
        self.control = ControlBudget(limits.control_frames_per_s, limits.control_frames_burst, now)
        self.chatter = ControlBudget(limits.chatter_frames_per_s, limits.chatter_frames_burst, now)
        self.closed = s.ClosedStreams(limits.remembered_resets)
        self.streams: dict[int, Stream] = {}
        self.timers = StreamTimers()
        self.starved: dict[int, Stream] = {}  # streams whose credit waits for the budget
        self.events: list[ev.Event] = []
        self.output = Output()
        self.out = self.output.chunks
        self.out.append(limits.preface())
        self.inbuf, self.inpos = b"", 0
        self.preface_seen = self.settings_seen = False
        self.handshake_due = now + limits.handshake_timeout_s
        self.settings_due = now + limits.settings_ack_timeout_s
        self.last_stream_id = 0
        self.recv_window = max(limits.connection_window, f.DEFAULT_WINDOW)
        self.credit = 0  # connection receive window to credit back
        self.local_initial_window = max(limits.stream_window, f.DEFAULT_WINDOW)  # until ACKed
        self.draining = self.peer_gone = self.backlogged = self.closing = False
        self.end_code, self.end_reason = f.NO_ERROR, ""

    # -- input -----------------------------------------------------------------------------

    def receive(self, data: bytes, now: float) -> list[ev.Event]:
        """Handle `data` read from the client; b"" goes on after a turn left `backlogged`."""
        events = self.events = []
        if self.closing:
            return events
        self.now = now
        if data:  # b"" goes on with what is buffered, without copying it
            self.inbuf = self.inbuf[self.inpos :] + data if self.inpos < len(self.inbuf) else data
            self.inpos = 0
        try:
            if self.preface_seen or self._read_preface():
                self._read_frames()
            self._end_turn()
        except f.ConnectionFault as fault:
            self._fail(fault.code, fault.reason)
        if self.closing:
            events.append(ev.ConnectionEnded(self.end_code, self.end_reason))
        return events

    def data_to_send(self) -> bytes:
        return self.output.take()

    def _read_preface(self) -> bool:
        seen = self.inbuf[: len(f.PREFACE)]
        if not f.PREFACE.startswith(seen):
            raise f.ConnectionFault(f.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
        if len(seen) < len(f.PREFACE):
            return False
        self.inpos, self.preface_seen = len(f.PREFACE), True
        return True

    def _read_frames(self) -> None:
        buf, pos, size = self.inbuf, self.inpos, len(self.inbuf)
        turn, max_frame = self.limits.frames_per_turn, self.limits.max_frame_bytes
        self.backlogged = False
        while size - pos >= 9 and not self.closing:
            if turn == 0:
                self.backlogged = True
                self.counters.turns_cut += 1
                break
            length = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
            if length > max_frame:
                self.counters.frames_too_large += 1
                raise f.ConnectionFault(f.FRAME_SIZE_ERROR, f"a frame of {length} octets")
            if size - pos - 9 < length:
                break
            head = pos + 5  # the stream identifier, its reserved bit dropped
            stream_id = (buf[head] & 0x7F) << 24 | buf[head + 1] << 16 | buf[head + 2] << 8
            stream_id |= buf[head + 3]
            kind, flags, payload = buf[pos + 3], buf[pos + 4], buf[pos + 9 : pos + 9 + length]
            self.inpos = pos = pos + 9 + length
            turn -= 1
            try:
                self._frame(kind, flags, stream_id, payload)
            except f.StreamFault as fault:
                self._stream_error(fault.stream_id, fault.code, fault.reason)

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self.assembler.stream_id and kind != f.CONTINUATION:
            raise f.ConnectionFault(f.PROTOCOL_ERROR, "a header block interrupted")
        if not self.settings_seen and (kind != f.SETTINGS or flags & f.ACK):
            raise f.ConnectionFault(f.PROTOCOL_ERROR, "the preface not followed by SETTINGS")
        if kind == f.DATA:
            self._on_data(flags, stream_id, payload)
        elif kind in (f.HEADERS, f.CONTINUATION):
            if stream_id == 0:
                raise f.ConnectionFault(f.PROTOCOL_ERROR, f"{f.FRAME_NAMES[kind]} on stream 0")
            if kind == f.CONTINUATION and not payload:
                self._chat(kind)
            assembler = self.assembler
            block = (assembler.headers if kind == f.HEADERS else assembler.continuation)(
                flags, stream_id, payload
            )
            if block is not None:
                self._header_block(stream_id, block)
        elif kind < f.FRAME_TYPES:
            self._on_control(kind, flags, stream_id, payload)
        else:
            self._chat(kind)  # an unknown type: ignored (§5.5), at a cost

    def _state(self, stream_id: int) -> int:
        stream = self.streams.get(stream_id)
        if stream is None:
            return self.closed.state(stream_id, self.last_stream_id)
        return stream.state

    def _check(self, state: int, kind: int, stream_id: int) -> bool:
        """What the table says of `kind` on a stream in `state`: True to process the frame,
        False to drop it; an error is raised."""
        verdict = s.RECEIVE[state][kind]
        if verdict <= s.IGNORE:
            return verdict == s.ACCEPT
        reason = f"{f.FRAME_NAMES[kind]} on {s.STATE_NAMES[state]} stream {stream_id}"
        if verdict & s.SCOPE == s.STREAM_ERROR:
            raise f.StreamFault(stream_id, verdict & 0xFF, reason)
        if state == s.CLOSED and kind == f.HEADERS and self.closed.was_skipped(stream_id):
            raise f.ConnectionFault(f.PROTOCOL_ERROR, f"HEADERS on skipped stream {stream_id}")
        raise f.ConnectionFault(verdict & 0xFF, reason)

    # -- DATA, and the messages in it ------------------------------------------------------

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise f.ConnectionFault(f.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self.recv_window -= size
        if self.recv_window < 0:
            raise f.ConnectionFault(f.FLOW_CONTROL_ERROR, "the connection's window overrun")
        data = f.unpadded(payload, flags) if flags & f.PADDED else payload
        end = flags & f.END_STREAM != 0
        if not data and not end:
            self._chat(f.DATA)
        stream = self.streams.get(stream_id)
        state = self._state(stream_id) if stream is None else stream.state
        if stream is None or s.RECEIVE[state][f.DATA] != s.ACCEPT:
            self.credit += size  # dropped, but counted against the window (§5.1 "closed")
            self._check(state, f.DATA, stream_id)
            return
        try:
            stream.arrived(size, len(data), end)
        except f.StreamFault:
            self.credit += size  # the stream ends here: the frame's window comes back
            raise
        if size != len(data):  # padding: its window comes back at once
            self.credit += size - len(data)
            stream.owed += size - len(data)
        self._request_data(stream, data, end)

    def _request_data(self, stream: Stream, data: bytes, end: bool) -> None:
        unary = stream.kind == UNARY and stream.request is None and stream.reader is None
        whole = len(data) <= self.max_message + PREFIX and whole_message(data)
        if end and unary and whole:  # the common request: HEADERS, then this
            stream.state = s.AFTER_END_RECEIVED[stream.state]
            self.credit += len(data)
            self._hand_unary(stream, data[PREFIX:])
            return
        events = len(self.events)
        try:
            self.credit += stream.take(data, end, self.budget, self.max_message, self.events)
        except MessageFault as fault:
            self.credit += len(data)  # the call ends here: the frame's window comes back
            if end:  # the client is done too: no RST_STREAM after our answer
                stream.state = s.AFTER_END_RECEIVED[stream.state]
            self._call_failed(stream, fault)
            return
        if stream.kind == STREAMING and len(self.events) > events:
            stream.receive_due = self.now + self.limits.stream_idle_timeout_s
        if end:
            self._request_end(stream)
        elif stream.owed:
            self._grant(stream)

    def _hand_unary(self, stream: Stream, message: bytes) -> None:
        stream.receive_due = NEVER
        stream.started = True
        deadline = stream.deadline_or_none()
        self.events.append(ev.UnaryRequest(stream.stream_id, stream.head, deadline, message))

    def _request_end(self, stream: Stream) -> None:
        """END_STREAM from the client, on DATA or trailers."""
        stream.state = s.AFTER_END_RECEIVED[stream.state]
        if stream.kind == v.REFUSED:
            if stream.state == s.CLOSED:
                self._forget(stream)
            return
        try:
            message = stream.request_ended(self.events)
        except MessageFault as fault:
            self._call_failed(stream, fault)
            return
        if message is not None:
            self.budget.release(stream.request_reserved)
            stream.request, stream.request_reserved = None, 0
            self._hand_unary(stream, message)

    def _grant(self, stream: Stream) -> None:
        """Credit a stream's receive window back once half of it is owed, or at once when a
        reserved message needs more than the window leaves."""
        reader = stream.reader
        urgent = reader is not None and reader.missing() > stream.recv_window
        if stream.owed >= self.limits.stream_window // 2 or (urgent and stream.owed):
            self.out.append(f.window_update_frame(stream.stream_id, stream.owed))
            stream.recv_window += stream.owed
            stream.owed = 0

    def _end_turn(self) -> None:
        if self.starved and self.budget.has_room():
            for stream in self.starved.values():
                stream.owed += stream.withheld
                stream.withheld = 0
                self._grant(stream)
            self.starved.clear()
        if self.credit >= self.limits.connection_window // 4:
            self.out.append(f.window_update_frame(0, self.credit))
            self.recv_window += self.credit
            self.credit = 0

    # -- header blocks: requests and trailers ----------------------------------------------

    def _header_block(self, stream_id: int, block: bytes) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:
            self._trailers(stream, self.blocks.trailers(block))
            return
        if not stream_id & 1:
            raise f.ConnectionFault(f.PROTOCOL_ERROR, f"HEADERS on even stream {stream_id}")
        if not self._check(self.closed.state(stream_id, self.last_stream_id), f.HEADERS, stream_id):
            self.blocks.request(block)  # dropped, once the HPACK table has seen it (§4.3)
            return
        self.closed.opened(stream_id, self.last_stream_id)
        self.last_stream_id = stream_id
        head = self.blocks.request(block)
        if self.assembler.self_dependent:
            raise f.StreamFault(stream_id, f.PROTOCOL_ERROR, "a stream depending on itself")
        if self.draining or len(self.streams) >= self.limits.max_concurrent_streams:
            self.counters.refused_streams += 1
            self._spend(f.HEADERS)
            self._reset(stream_id, f.REFUSED_STREAM, "", tell=False)
            return
        end = self.assembler.end_stream
        if head.kind == v.MALFORMED or (end and head.content_length > 0):
            self.counters.malformed_requests += 1
            raise f.StreamFault(stream_id, f.PROTOCOL_ERROR, head.problem or "no DATA")
        self._opened(stream_id, head, end)

    def _opened(self, stream_id: int, head: RequestHead, end: bool) -> None:
        stream = self.streams[stream_id] = Stream(
            stream_id, head, self.local_initial_window, self.output.initial_window
        )
        stream.state = s.HALF_CLOSED_REMOTE if end else s.OPEN
        if head.timeout_s >= 0:
            stream.deadline = self.now + head.timeout_s
        self.timers.opened(stream)
        if head.kind == v.REFUSED:
            self.counters.header_lists_too_large += head.problem == v.OVERSIZED
            self._refuse(stream)
            return
        if head.kind == STREAMING:
            stream.started = True
            self.events.append(ev.RequestStarted(stream_id, head, stream.deadline_or_none()))
            stream.receive_due = self.now + self.limits.stream_idle_timeout_s
        else:
            stream.receive_due = self.now + self.limits.unary_receive_timeout_s
        if end:
            self._request_end(stream)

    def _refuse(self, stream: Stream) -> None:
        """Answer a request from its headers alone (RFC 9113 §8.1 lets a server answer before
        the request ends). Its rest is read and dropped, its content-length still checked,
        until the client ends it or the unary receive timeout."""
        head, stream_id = stream.head, stream.stream_id
        stream.deadline = NEVER
        stream.receive_due = self.now + self.limits.unary_receive_timeout_s
        if not head.body:  # gRPC's trailers-only answer
            self.out.append(f.frame(f.HEADERS, _END_OF_BLOCK, stream_id, head.refusal))
            self._end_sent(stream)
            return
        self.out.append(f.frame(f.HEADERS, f.END_HEADERS, stream_id, head.refusal))
        stream.queue(head.body)
        stream.trailers = b""  # END_STREAM on the body's DATA
        if self.output.send(stream):
            self._end_sent(stream)

    def _trailers(self, stream: Stream, headers: list[tuple[bytes, bytes]]) -> None:
        """A second header block: trailers, which end the request (§8.1)."""
        stream_id = stream.stream_id
        self._check(stream.state, f.HEADERS, stream_id)
        if self.assembler.self_dependent:
            raise f.StreamFault(stream_id, f.PROTOCOL_ERROR, "a stream depending on itself")
        if not self.assembler.end_stream:
            raise f.StreamFault(stream_id, f.PROTOCOL_ERROR, "a second HEADERS without END_STREAM")
        problem = v.trailers_problem(headers)
        if problem:
            self.counters.malformed_requests += 1
            raise f.StreamFault(stream_id, f.PROTOCOL_ERROR, problem)
        stream.count_length(0, True)
        self._request_end(stream)

    # -- frames of the connection ----------------------------------------------------------

    def _on_control(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        f.check_stream_zero(kind, stream_id)
        f.check_fixed_length(kind, len(payload))
        if kind == f.PUSH_PROMISE:
            raise f.ConnectionFault(f.PROTOCOL_ERROR, "PUSH_PROMISE from a client (§8.4)")
        self._charge(kind, flags, stream_id, payload)
        if kind == f.SETTINGS:
            self._on_settings(flags, payload)
        elif kind == f.PING:
            if not flags & f.ACK:  # an ACK answers nothing: we send no PING
                self.out.append(f.frame(f.PING, f.ACK, 0, payload))
        elif kind == f.GOAWAY:
            self.peer_gone = True  # it opens no more streams: close once ours are done
            if not self.streams:
                self._close(f.NO_ERROR, "the client sent GOAWAY")
        elif kind == f.WINDOW_UPDATE:
            self._on_window_update(stream_id, int.from_bytes(payload, "big") & 0x7FFFFFFF)
        elif self._check(self._state(stream_id), kind, stream_id):
            if kind == f.RST_STREAM:
                stream = self.streams[stream_id]
                if stream.started:
                    code = int.from_bytes(payload, "big")
                    self.events.append(ev.StreamReset(stream_id, code, "reset by the client"))
                self._forget(stream)
            elif len(payload) != 5:  # PRIORITY
                self._priority_error(stream_id, f.FRAME_SIZE_ERROR, "PRIORITY not of 5 octets")
            elif f.priority_dependency(payload, 0) == stream_id:
                self._priority_error(stream_id, f.PROTOCOL_ERROR, "a stream depending on itself")

    def _priority_error(self, stream_id: int, code: int, reason: str) -> None:
        """§5.3.1 and §6.3 name a stream error; on an idle stream (PRIORITY opens none) it is a
        connection error, since §6.4 forbids RST_STREAM on an idle stream."""
        if self._state(stream_id) == s.IDLE:
            raise f.ConnectionFault(code, f"{reason} (idle stream {stream_id})")
        raise f.StreamFault(stream_id, code, reason)

    def _on_settings(self, flags: int, payload: bytes) -> None:
        if flags & f.ACK:
            if payload:
                raise f.ConnectionFault(f.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            if self.settings_due != NEVER:  # our SETTINGS apply from now on (§6.5.3)
                self.settings_due = NEVER
                delta = self.limits.stream_window - self.local_initial_window
                for stream in self.streams.values():
                    stream.recv_window += delta
                self.local_initial_window = self.limits.stream_window
            return
        entries = f.settings_entries(payload)
        self.settings_seen, self.handshake_due = True, NEVER
        windows = [value for key, value in entries if key == f.SETTINGS_INITIAL_WINDOW_SIZE]
        if windows:
            streams = list(self.streams.values())
            self.output.initial_window_changed(streams, max(windows), windows[-1])
        for key, value in entries:
            if key == f.SETTINGS_MAX_FRAME_SIZE:
                self.output.max_frame = value
        self.out.append(f.frame(f.SETTINGS, f.ACK, 0))
        self._unblock()

    def _on_window_update(self, stream_id: int, increment: int) -> None:
        if stream_id == 0:
            if not increment:
                raise f.ConnectionFault(f.PROTOCOL_ERROR, "WINDOW_UPDATE of 0 on the connection")
            self.output.connection_window_update(increment)
            self._unblock()
        elif self._check(self._state(stream_id), f.WINDOW_UPDATE, stream_id):
            stream = self.streams[stream_id]
            if not increment:
                raise f.StreamFault(stream_id, f.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            stream.send_window += increment
            if stream.send_window > f.MAX_WINDOW:
                raise f.StreamFault(stream_id, f.FLOW_CONTROL_ERROR, "a window over 2^31-1")
            if stream_id in self.output.blocked:
                self._unblock(stream)

    def _unblock(self, only: Stream | None = None) -> None:
        for stream in self.output.unblock(only):
            if stream.started:
                self.events.append(ev.WindowOpened(stream.stream_id))
            if stream.trailers is not None:  # written: the response is complete
                self._end_sent(stream)

    def _charge(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        """A control frame's token: RST_STREAM from the control bucket (a busy client cancels
        calls often); a WINDOW_UPDATE crediting what we sent is free (grpc's C-core credits
        every answer it reads); a SETTINGS ACK answers ours, free; the rest is chatter."""
        if kind == f.RST_STREAM:
            self._spend(kind)
        elif kind == f.WINDOW_UPDATE:
            increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
            if not self.output.credits_sent(stream_id, increment):
                self._chat(kind)
        elif not (kind == f.SETTINGS and flags & f.ACK):
            self._chat(kind)

    def _chat(self, kind: int) -> None:
        if not self.chatter.spend(self.now):
            self._flood(kind)

    def _spend(self, kind: int) -> None:
        if not self.control.spend(self.now):
            self._flood(kind)

    def _flood(self, kind: int) -> None:
        self.counters.control_floods += 1
        name = f.FRAME_NAMES[kind] if kind < f.FRAME_TYPES else "unknown"
        reason = "too_many_pings" if kind == f.PING else f"too many {name} frames"
        raise f.ConnectionFault(f.ENHANCE_YOUR_CALM, reason)

    # -- ends of streams and of the connection ---------------------------------------------

    def _stream_error(self, stream_id: int, code: int, reason: str) -> None:
        self.counters.stream_errors += 1
        self._spend(f.RST_STREAM)
        self._reset(stream_id, code, reason, tell=True)

    def _reset(self, stream_id: int, code: int, reason: str, tell: bool) -> None:
        self.out.append(f.rst_stream_frame(stream_id, code))
        self.closed.reset_sent(stream_id)
        stream = self.streams.get(stream_id)
        if stream is not None:
            if tell and stream.started:
                self.events.append(ev.StreamReset(stream_id, code, reason))
            self._forget(stream)

    def _call_failed(self, stream: Stream, fault: MessageFault) -> None:
        self.counters.messages_too_large += fault.bound == "size"
        self.counters.budget_refusals += fault.bound == "budget"
        self._end_now(stream, fault.status, fault.message)

    def _end_now(self, stream: Stream, status: int, message: str) -> None:
        """End a call with a gRPC status at once, dropping what it had queued."""
        if stream.started:
            self.events.append(ev.StreamReset(stream.stream_id, f.NO_ERROR, message))
        self.output.drop(stream)
        block = grpc_status_block(status, message, not stream.headers_sent)
        self.out.append(f.frame(f.HEADERS, _END_OF_BLOCK, stream.stream_id, block))
        self._end_sent(stream)

    def _end_sent(self, stream: Stream) -> None:
        """Our END_STREAM went out. A call whose client still sends is asked to stop with
        RST_STREAM NO_ERROR (§8.1); a refused request's rest is read and dropped."""
        stream.state = s.AFTER_END_SENT[stream.state]
        if stream.state == s.HALF_CLOSED_LOCAL and stream.kind != v.REFUSED:
            self.out.append(f.rst_stream_frame(stream.stream_id, f.NO_ERROR))
            self.closed.reset_sent(stream.stream_id)
            stream.state = s.RESET_SENT
        if stream.state != s.HALF_CLOSED_LOCAL:
            self._forget(stream)

    def _forget(self, stream: Stream) -> None:
        del self.streams[stream.stream_id]
        self.starved.pop(stream.stream_id, None)
        self.output.drop(stream)
        self.credit += stream.release(self.budget)
        if not self.streams and (self.draining or self.peer_gone):
            self._close(f.NO_ERROR, "drained" if self.draining else "the client sent GOAWAY")

    def _fail(self, code: int, reason: str) -> None:
        """A connection error (§5.4.1): GOAWAY with the newest stream we processed, then close."""
        if not self.closing:
            self.counters.connection_errors += code != f.NO_ERROR
            self.out.append(f.goaway_frame(self.last_stream_id, code, reason))
            self._close(code, reason)

    def _close(self, code: int, reason: str) -> None:
        self.closing = True
        self.end_code, self.end_reason = code, reason
        for stream in self.streams.values():
            self.output.drop(stream)
            stream.release(self.budget)
        self.streams.clear()
        self.starved.clear()

    # -- timers ----------------------------------------------------------------------------

    def next_timer(self) -> float | None:
        """When `on_timer` is next due (None: no timer needed)."""
        due = min(self.handshake_due, self.settings_due, self.timers.next_due(self.streams))
        if self.starved:
            due = min(due, self.now + BUDGET_RETRY_S)
        return None if due == NEVER or self.closing else due

    def on_timer(self, now: float) -> list[ev.Event]:
        events = self.events = []
        if self.closing:
            return events
        self.now = now
        try:
            if now >= self.handshake_due:
                self.counters.handshake_timeouts += 1
                raise f.ConnectionFault(f.PROTOCOL_ERROR, "no preface and SETTINGS in time")
            if now >= self.settings_due:
                self.counters.settings_timeouts += 1
                raise f.ConnectionFault(f.SETTINGS_TIMEOUT, "our SETTINGS not acknowledged")
            for stream in self.timers.due(self.streams, now):
                if self.streams.get(stream.stream_id) is stream:
                    self._expire(stream)
            self._end_turn()
        except f.ConnectionFault as fault:
            self._fail(fault.code, fault.reason)
        if self.closing:
            events.append(ev.ConnectionEnded(self.end_code, self.end_reason))
        return events

    def _expire(self, stream: Stream) -> None:
        limits, counters = self.limits, self.counters
        if stream.kind == v.REFUSED:  # the rest of a refused request never came: stop waiting
            answered = stream.state == s.HALF_CLOSED_LOCAL
            self._reset(stream.stream_id, f.NO_ERROR if answered else f.CANCEL, "", tell=False)
            return
        if stream.deadline <= self.now:
            counters.deadlines += 1
            text = "deadline exceeded"
        elif stream.kind == UNARY:
            counters.receive_timeouts += 1
            text = f"the request did not arrive within {limits.unary_receive_timeout_s:g} s"
        else:
            counters.closed_idle_streams += 1
            text = f"no request message for {limits.stream_idle_timeout_s:g} s"
        self._end_now(stream, GRPC_DEADLINE_EXCEEDED, text)

    # -- the adapter's answers -------------------------------------------------------------

    def answer_unary(self, stream_id: int, message: bytes) -> None:
        """A unary call's whole answer: headers, `message`, OK trailers; in one write when the
        windows allow, else queued (sent as they open)."""
        stream = self._answerable(stream_id)
        if stream is not None and self._whole_answer(stream, message):
            self._forget(stream)  # END_STREAM both ways: closed
            return
        self.send_message(stream_id, message)
        self.end_call(stream_id, 0)

    def _whole_answer(self, stream: Stream, message: bytes) -> bool:
        fresh = stream.state == s.HALF_CLOSED_REMOTE and not stream.headers_sent
        return fresh and self.output.unary(stream, message)

    def send_headers(self, stream_id: int) -> None:
        stream = self._answerable(stream_id)
        if stream is not None and not stream.headers_sent:
            stream.headers_sent = True
            self.out.append(f.frame(f.HEADERS, f.END_HEADERS, stream_id, GRPC_RESPONSE_HEADERS))

    def send_message(self, stream_id: int, message: bytes) -> None:
        """One response message, sent as far as the windows allow (`pending_output` tells the
        rest; WindowOpened follows once all of it is sent)."""
        stream = self._answerable(stream_id)
        if stream is not None:
            self.send_headers(stream_id)
            stream.queue(b"\0" + len(message).to_bytes(4, "big") + message)
            if self.output.send(stream):
                self._end_sent(stream)

    def end_call(self, stream_id: int, status: int, message: str = "") -> None:
        """The call's gRPC status, after its queued messages (trailers-only if none was sent)."""
        stream = self._answerable(stream_id)
        if stream is not None:
            if not stream.headers_sent:
                stream.trailers = grpc_status_block(status, message, True)
            elif status or message:
                stream.trailers = grpc_status_block(status, message, False)
            else:
                stream.trailers = GRPC_OK_TRAILERS
            if self.output.send(stream):
                self._end_sent(stream)

    def pending_output(self, stream_id: int) -> int:
        stream = self.streams.get(stream_id)
        return len(stream.pending) if stream is not None and stream.pending else 0

    def message_consumed(self, stream_id: int) -> None:
        """The adapter took the oldest Message of a streaming call: its credit goes back, the
        stream's while the message budget has room (else once it has)."""
        stream = self.streams.get(stream_id)
        if stream is None or not stream.dues:
            return
        connection, window, reserved = stream.consumed()
        self.budget.release(reserved)
        self.credit += connection
        if stream.state == s.OPEN:
            stream.withheld += window
            self.starved[stream_id] = stream
        self._end_turn()

    def reset(self, stream_id: int, code: int = f.CANCEL) -> None:
        """Cancel a call: RST_STREAM with `code`."""
        if stream_id in self.streams and not self.closing:
            self._reset(stream_id, code, "", tell=False)

    def drain(self) -> None:
        """Graceful shutdown: GOAWAY NO_ERROR with the newest stream; newer ones are refused
        (REFUSED_STREAM: the client may retry them elsewhere); close once the rest are done."""
        if not self.closing and not self.draining:
            self.draining = True
            self.out.append(f.goaway_frame(self.last_stream_id, f.NO_ERROR, "draining"))
            if not self.streams:
                self._close(f.NO_ERROR, "drained")

    def close(self, code: int, reason: str) -> None:
        """End the connection now: GOAWAY with `code`."""
        self._fail(code, reason)

    def connection_lost(self) -> None:
        """The transport closed: what the streams reserved goes back to the budget."""
        if not self.closing:
            self._close(f.CANCEL, "connection lost")

    def _answerable(self, stream_id: int) -> Stream | None:
        stream = self.streams.get(stream_id)
        if stream is None or not stream.started or stream.trailers is not None:
            return None
        return stream if stream.state in (s.OPEN, s.HALF_CLOSED_REMOTE) else None

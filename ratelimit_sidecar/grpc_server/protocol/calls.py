"""The protocol core of the gRPC port: a server connection's gRPC calls over its HTTP/2
(connection.py), without I/O. The adapter drives one Connection per transport:

- `receive(data, now)` with what was read: returns the events (events.py) in wire order. When
  `backlogged` is set after it, the turn stopped after `frames_per_turn` frames with complete
  frames left: the adapter lets other connections run, then calls `receive(b"", now)`.
- `data_to_send()` after every call: what to write; `next_timer()`: when `on_timer(now)` is due.
- the answers: `answer_unary`, or `send_headers`, `send_message`, `end_call`; `reset`;
  `message_consumed` for each Message a streaming handler takes; `drain` for a graceful
  GOAWAY; `close` for a connection error; `connection_lost` when the transport dies.
- `closing`: once set, write `data_to_send()` and close the transport. Events come only from
  `receive` and `on_timer`: a close an answer causes (a drain's last call) shows here alone.

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
from ratelimit_sidecar.grpc_server.protocol.connection import Http2Connection
from ratelimit_sidecar.grpc_server.protocol.limits import Counters, Limits
from ratelimit_sidecar.grpc_server.protocol.messages import (
    PREFIX,
    MessageBudget,
    MessageFault,
    whole_message,
)
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


class Connection(Http2Connection):
    """One connection's gRPC calls; `budget` and `counters` may be shared by many."""

    def __init__(
        self, limits: Limits, budget: MessageBudget, route: v.Route, now: float,
        counters: Counters | None = None,
    ) -> None:  # fmt: skip
        super().__init__(limits, budget, route, now, counters or Counters())
        self.timers = StreamTimers()
        self.starved: dict[int, Stream] = {}  # streams whose credit waits for the budget
        self.max_message = limits.max_message_bytes

    def data_to_send(self) -> bytes:
        return self.output.take()

    # -- requests ------------------------------------------------------------------------

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

    def _data(self, stream: Stream, data: bytes, end: bool) -> None:
        unary = stream.kind == UNARY and stream.request is None and stream.reader is None
        if end and unary and whole_message(data):  # the common request: HEADERS, then this
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

    def _trailers(self, stream: Stream, headers: list[tuple[bytes, bytes]]) -> None:
        """A second header block: trailers, which end the request (§8.1)."""
        stream_id = stream.stream_id
        self._check(stream.state, f.HEADERS, stream_id)
        if not self.assembler.end_stream:
            raise f.StreamFault(stream_id, f.PROTOCOL_ERROR, "a second HEADERS without END_STREAM")
        problem = v.trailers_problem(headers)
        if problem:
            self.counters.malformed_requests += 1
            raise f.StreamFault(stream_id, f.PROTOCOL_ERROR, problem)
        stream.count_length(0, True)
        self._request_end(stream)

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

    def _forget(self, stream: Stream) -> None:
        self.starved.pop(stream.stream_id, None)
        super()._forget(stream)

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

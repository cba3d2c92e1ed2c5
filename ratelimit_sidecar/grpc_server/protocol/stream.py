"""One stream of a connection, from its HEADERS until it closes: its RFC 9113 §5.1 state, its
two flow-control windows (§5.2, §6.9), the request's messages as they arrive and the response's
octets waiting for window.

The connection (connection.py) reads the state table (states.py) before handing a frame to a
stream, so a stream sees only the frames its state accepts, and it reports breaches by raising:
StreamFault for HTTP/2's (a content-length the DATA does not match: §8.1.1), MessageFault for
gRPC's (messages.py). The stream changes no window of the connection's; it tells how many
received octets may be credited back.
"""

from __future__ import annotations

from typing import Final

from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol import states as s
from ratelimit_sidecar.grpc_server.protocol.events import Event, Message, RequestEnded
from ratelimit_sidecar.grpc_server.protocol.messages import (
    GRPC_INTERNAL,
    PREFIX,
    Cut,
    MessageBudget,
    MessageFault,
    MessageReader,
    release_all,
    whole_message,
)
from ratelimit_sidecar.grpc_server.protocol.validation import STREAMING, UNARY, RequestHead

NEVER: Final = float("inf")


class Stream:
    """A stream the connection holds: open or half-closed (a closed one is forgotten)."""

    __slots__ = (
        "deadline", "dues", "head", "headers_sent", "kind", "length_left", "owed", "pending",
        "reader", "receive_due", "recv_window", "request", "request_reserved", "send_window",
        "started", "state", "stream_id", "trailers", "withheld",
    )  # fmt: skip

    def __init__(
        self, stream_id: int, head: RequestHead, recv_window: int, send_window: int
    ) -> None:
        self.stream_id = stream_id
        self.head = head
        self.kind = head.kind
        self.state = s.OPEN
        self.recv_window = recv_window  # octets the client may still send on it
        self.send_window = send_window  # octets we may still send (may go below 0: §6.9.2)
        self.owed = 0  # receive window to credit back with the next WINDOW_UPDATE
        self.withheld = 0  # receive window consumed, waiting for the message budget's room
        self.length_left = head.content_length  # -1: no content-length
        self.deadline = NEVER  # grpc-timeout
        self.receive_due = NEVER  # the unary request's end, or a streaming call's next message
        self.started = False  # the adapter holds the call (UnaryRequest or RequestStarted sent)
        self.reader: MessageReader | None = None
        self.request: bytes | None = None  # a unary call's message, until its END_STREAM
        self.request_reserved = 0
        self.dues: list[Cut] | None = None  # a streaming call's messages not consumed yet
        self.headers_sent = False
        self.pending: bytearray | None = None  # response octets waiting for window
        self.trailers: bytes | None = None  # the block that ends the response (b"": DATA does)

    def due(self) -> float:
        return min(self.deadline, self.receive_due)

    def deadline_or_none(self) -> float | None:
        return None if self.deadline == NEVER else self.deadline

    # -- receiving -------------------------------------------------------------------------

    def arrived(self, size: int, data: int, end: bool) -> None:
        """A DATA frame of `size` octets, `data` of them not padding: it must fit the stream's
        window (§6.9.1: else FLOW_CONTROL_ERROR) and add up to the content-length (§8.1.1)."""
        self.recv_window -= size
        if self.recv_window < 0:
            raise f.StreamFault(self.stream_id, f.FLOW_CONTROL_ERROR, "the stream's window overrun")
        self.count_length(data, end)

    def count_length(self, size: int, end: bool) -> None:
        """The DATA adds up to the request's content-length, or the request is malformed."""
        if self.length_left < 0:
            return
        self.length_left -= size
        if self.length_left < 0 or (end and self.length_left):
            raise f.StreamFault(self.stream_id, f.PROTOCOL_ERROR, "DATA unlike content-length")

    def take(
        self, data: bytes, end: bool, budget: MessageBudget, max_bytes: int, events: list[Event]
    ) -> int:
        """`data` of a DATA frame (unpadded, counted already): the messages it completes.
        Returns how many of its octets the connection may credit back now."""
        if self.kind not in (UNARY, STREAMING):
            return len(data)  # a refused request's rest is dropped
        if self.reader is None and len(data) <= max_bytes + PREFIX and whole_message(data):
            cuts = [Cut(data[PREFIX:], 0, 0, 0)]
        else:
            if self.reader is None:
                self.reader = MessageReader(budget, max_bytes)
            cuts = self.reader.feed(data)
            self.owed += self._advance()
        if self.kind == UNARY:
            for index, cut in enumerate(cuts):
                try:
                    self._hold(cut, end, budget)
                except MessageFault:
                    release_all(budget, cuts[index:])  # the ones not held
                    raise
            return len(data)
        return len(data) - self._hand_out(cuts, events)

    def _hold(self, cut: Cut, end: bool, budget: MessageBudget) -> None:
        """A unary call's message, kept until the request ends; kept in the budget."""
        if self.request is not None:
            raise MessageFault(GRPC_INTERNAL, "a unary call with more than one request message")
        self.request = cut.message
        self.request_reserved = cut.reserved
        if not end and not cut.reserved:
            budget.reserve(len(cut.message) + PREFIX)
            self.request_reserved = len(cut.message) + PREFIX

    def _hand_out(self, cuts: list[Cut], events: list[Event]) -> int:
        """A streaming call's messages to the adapter; returns the octets whose credit waits
        for the adapter to consume them (reserved ones were credited as they arrived)."""
        held = 0
        for cut in cuts:
            events.append(Message(self.stream_id, cut.message))
            if self.dues is None:
                self.dues = []
            if not cut.reserved:
                cut.held = PREFIX + len(cut.message) - cut.earlier
                held += cut.held
            self.dues.append(cut)
        return held

    def _advance(self) -> int:
        """Window granted ahead of a reserved message that the window could not carry whole."""
        reader = self.reader
        if reader is None or not reader.reserved or reader.missing() <= self.recv_window:
            return 0
        grant = reader.missing() - self.recv_window
        reader.advance += grant
        return grant

    def consumed(self) -> tuple[int, int, int]:
        """The adapter took the oldest Message: (connection credit, stream credit, budget
        octets) it releases."""
        assert self.dues
        cut = self.dues.pop(0)
        return cut.held, PREFIX + len(cut.message) - cut.advance, cut.reserved

    def request_ended(self, events: list[Event]) -> bytes | None:
        """END_STREAM arrived: a unary call's message (None for a streaming call, whose end is
        an event). A message cut short, or a unary call without one, is an INTERNAL error."""
        if self.reader is not None and self.reader.buffer:
            raise MessageFault(GRPC_INTERNAL, "the request ended inside a message")
        self.receive_due = NEVER
        if self.kind == STREAMING:
            events.append(RequestEnded(self.stream_id))
            return None
        if self.kind == UNARY and self.request is None:
            raise MessageFault(GRPC_INTERNAL, "a unary call without a request message")
        return self.request

    def release(self, budget: MessageBudget) -> int:
        """The stream is done: what it reserved goes back to the budget; returns the connection
        credit of the messages handed out and never consumed."""
        if self.reader is not None:
            self.reader.close()
        budget.release(self.request_reserved)
        self.request_reserved = 0
        credit = 0
        for cut in self.dues or ():
            budget.release(cut.reserved)
            credit += cut.held
        self.dues = None
        return credit

    # -- sending ---------------------------------------------------------------------------

    def queue(self, octets: bytes) -> None:
        if self.pending is None:
            self.pending = bytearray()
        self.pending += octets

    def pump(self, connection_window: int, max_frame: int, out: list[bytes], end: bool) -> int:
        """DATA frames of the pending octets, as far as both windows let, the last one with
        END_STREAM if `end`; returns the octets sent (the caller lowers the connection's
        window)."""
        pending = self.pending
        sent = 0
        while pending:
            size = min(len(pending), connection_window - sent, self.send_window, max_frame)
            if size <= 0:
                break
            flags = f.END_STREAM if end and size == len(pending) else 0
            header = f.FRAME_HEADER.pack(size >> 16, size & 0xFFFF, f.DATA, flags, self.stream_id)
            out.append(header + pending[:size])
            del pending[:size]
            self.send_window -= size
            sent += size
        return sent

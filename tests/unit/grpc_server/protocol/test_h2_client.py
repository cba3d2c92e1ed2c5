"""The core against python-hyper's h2 as the client: h2 checks every frame the core writes
(a frame it finds invalid ends the test with its ProtocolError)."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events

from ratelimit_sidecar.grpc_server.protocol import events as ev
from ratelimit_sidecar.grpc_server.protocol.connection import Connection
from ratelimit_sidecar.grpc_server.protocol.limits import Limits
from ratelimit_sidecar.grpc_server.protocol.messages import MessageBudget
from tests.unit.grpc_server.protocol.peer import (
    STREAM_PATH,
    grpc_message,
    request_fields,
    route,
)


class H2Client:
    """An h2 client connection and a core, wired back to back."""

    def __init__(self, window: int | None = None) -> None:
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.client.initiate_connection()
        if window is not None:
            self.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.core = Connection(Limits(), MessageBudget(1 << 24), route, 0.0)
        self.received: list[h2.events.Event] = []
        self.pump()

    def pump(self) -> list[ev.Event]:
        """Exchange octets both ways until neither side has any to send."""
        events: list[ev.Event] = []
        while True:
            to_core, to_client = self.client.data_to_send(), self.core.data_to_send()
            if not to_core and not to_client:
                return events
            if to_client:
                self.received += self.client.receive_data(to_client)
            if to_core:
                events += self.core.receive(to_core, 0.0)

    def data(self) -> list[h2.events.DataReceived]:
        return [e for e in self.received if isinstance(e, h2.events.DataReceived)]

    def trailers(self) -> list[h2.events.TrailersReceived]:
        return [e for e in self.received if isinstance(e, h2.events.TrailersReceived)]

    def ended(self) -> int:
        return sum(isinstance(e, h2.events.StreamEnded) for e in self.received)


def test_unary_calls_through_h2() -> None:
    peer = H2Client()
    for stream_id in (1, 3, 5):
        peer.client.send_headers(stream_id, request_fields())
        peer.client.send_data(stream_id, grpc_message(b"q%d" % stream_id), end_stream=True)
    requests = peer.pump()
    assert [type(e) for e in requests] == [ev.UnaryRequest] * 3
    for request in requests:
        assert isinstance(request, ev.UnaryRequest)
        peer.core.answer_unary(request.stream_id, b"a" + request.message)
    peer.pump()
    bodies = {e.stream_id: e.data for e in peer.data()}
    assert bodies == {i: grpc_message(b"aq%d" % i) for i in (1, 3, 5)}
    trailers = peer.trailers()
    assert [dict(t.headers or [])[b"grpc-status"] for t in trailers] == [b"0"] * 3
    assert peer.ended() == 3


def test_a_streaming_call_with_small_windows_through_h2() -> None:
    peer = H2Client(window=1000)
    peer.client.send_headers(1, request_fields(STREAM_PATH))
    peer.client.send_data(1, grpc_message(b"report"))
    _, message = peer.pump()
    assert isinstance(message, ev.Message) and message.data == b"report"
    peer.core.message_consumed(1)
    for _ in range(5):
        peer.core.send_message(1, b"z" * 900)  # more than the client's window
    peer.pump()
    assert peer.core.pending_output(1) > 0  # held by the client's window
    opened = []
    for _ in range(10):  # the client reads what came, which opens its window again
        for data in peer.data():
            peer.client.acknowledge_received_data(data.flow_controlled_length, data.stream_id)
        peer.received.clear()
        opened += [e for e in peer.pump() if isinstance(e, ev.WindowOpened)]
    assert peer.core.pending_output(1) == 0 and len(opened) == 1
    peer.client.end_stream(1)
    assert [type(e) for e in peer.pump()] == [ev.RequestEnded]
    peer.core.end_call(1, 0)
    peer.pump()
    assert peer.ended() == 1

"""The happy paths of the gRPC calls over the core: unary, server-streaming, bidirectional,
trailers from the client, flow control holding and releasing responses, graceful drain."""

from __future__ import annotations

from ratelimit_sidecar.grpc_server.protocol import events as ev
from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol.limits import Limits
from tests.unit.grpc_server.protocol.peer import (
    STREAM_PATH,
    UNARY_PATH,
    Peer,
    grpc_message,
    grpc_status,
)


def kinds(events: list[ev.Event]) -> list[str]:
    return [type(event).__name__ for event in events]


def test_a_unary_call_in_one_read_is_one_event_and_one_answer() -> None:
    peer = Peer()
    (request,) = peer.send(peer.call(1, b"hello"))
    assert isinstance(request, ev.UnaryRequest)
    assert (request.stream_id, request.message, request.head.path) == (
        1,
        b"hello",
        b"/test.Service/Unary",
    )
    assert request.deadline is None
    peer.core.answer_unary(1, b"world")
    headers, data, trailers = peer.read()
    assert headers.fields == {":status": "200", "content-type": "application/grpc"}
    assert data.payload == grpc_message(b"world") and not data.ends_stream
    assert trailers.ends_stream and grpc_status(trailers) == 0
    assert peer.core.streams == {}


def test_eight_calls_in_one_read_repeat_one_cached_head() -> None:
    peer = Peer()
    peer.send(b"".join(peer.call(1 + 2 * i, b"m%d" % i) for i in range(8)))
    assert kinds(peer.events) == ["UnaryRequest"] * 8
    heads = {id(event.head) for event in peer.events if isinstance(event, ev.UnaryRequest)}
    assert len(heads) <= 2  # the first block fills the HPACK table; the repeats share one head
    for event in peer.events:
        assert isinstance(event, ev.UnaryRequest)
        peer.core.answer_unary(event.stream_id, event.message)
    assert len(peer.read()) == 24


def test_a_unary_request_ended_by_an_empty_data_frame() -> None:
    """grpc-go's way: the message, then END_STREAM on an empty DATA frame."""
    peer = Peer()
    assert peer.send(peer.headers(1), peer.data(1, grpc_message(b"hi"), end_stream=False)) == []
    (request,) = peer.send(peer.data(1, b""))
    assert isinstance(request, ev.UnaryRequest) and request.message == b"hi"
    assert peer.budget.used == 0


def test_a_unary_message_split_over_frames_and_reads() -> None:
    peer = Peer()
    message = grpc_message(b"x" * 40_000)
    peer.send(peer.headers(1), peer.data(1, message[:3], end_stream=False))
    peer.send(peer.data(1, message[3:16_000], end_stream=False))
    assert peer.budget.used == len(message)  # reserved whole once its length was known
    peer.send(peer.data(1, message[16_000:32_000], end_stream=False))
    (request,) = peer.send(peer.data(1, message[32_000:]))
    assert isinstance(request, ev.UnaryRequest) and request.message == b"x" * 40_000
    assert peer.budget.used == 0


def test_a_unary_message_larger_than_the_stream_window_gets_window_ahead() -> None:
    peer = Peer()
    message = grpc_message(b"y" * 100_000)
    peer.send(peer.headers(1), peer.data(1, message[:16_000], end_stream=False))
    updates = [x for x in peer.read() if x.kind == f.WINDOW_UPDATE and x.stream_id == 1]
    granted = sum(int.from_bytes(x.payload, "big") for x in updates)
    assert granted >= len(message) - f.DEFAULT_WINDOW
    chunks = [message[i : i + 16_000] for i in range(16_000, len(message), 16_000)]
    peer.send(*(peer.data(1, chunk, end_stream=False) for chunk in chunks), peer.data(1, b""))
    assert isinstance(peer.events[0], ev.UnaryRequest)


def test_a_grpc_timeout_becomes_a_deadline() -> None:
    peer = Peer()
    peer.now = 100.0
    peer.send(peer.headers(1, extra=[("grpc-timeout", "250m")]), peer.data(1, grpc_message(b"")))
    assert isinstance(peer.events[0], ev.UnaryRequest) and peer.events[0].deadline == 100.25


def test_a_server_streaming_call() -> None:
    """A unary request, then many response messages (health Watch's shape)."""
    peer = Peer()
    (request,) = peer.send(peer.call(1))
    assert isinstance(request, ev.UnaryRequest)
    peer.core.send_message(1, b"one")
    peer.core.send_message(1, b"two")
    peer.core.end_call(1, 0)
    frames = peer.read()
    assert [x.kind for x in frames] == [f.HEADERS, f.DATA, f.DATA, f.HEADERS]
    assert [x.payload for x in frames[1:3]] == [grpc_message(b"one"), grpc_message(b"two")]
    assert frames[-1].ends_stream and frames[-1].fields == {"grpc-status": "0"}


def test_a_bidirectional_streaming_call() -> None:
    peer = Peer()
    started = peer.send(peer.headers(1, STREAM_PATH))
    assert kinds(started) == ["RequestStarted"]
    two = grpc_message(b"a") + grpc_message(b"bc")
    messages = peer.send(peer.data(1, two, end_stream=False))
    assert [(type(m), m.data) for m in messages if isinstance(m, ev.Message)] == [
        (ev.Message, b"a"),
        (ev.Message, b"bc"),
    ]
    peer.core.message_consumed(1)
    peer.core.send_message(1, b"reply")
    ended = peer.send(peer.data(1, grpc_message(b"last")))
    assert kinds(ended) == ["Message", "RequestEnded"]
    peer.core.end_call(1, 0)
    assert peer.read()[-1].fields == {"grpc-status": "0"}
    assert peer.core.streams == {}


def test_trailers_from_the_client_end_its_request() -> None:
    peer = Peer()
    trailers = f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, peer.block([("x-end", "1")]))
    peer.send(peer.headers(1), peer.data(1, grpc_message(b"m"), end_stream=False), trailers)
    assert kinds(peer.events) == ["UnaryRequest"]


def test_a_status_with_a_message_is_percent_encoded_trailers_only() -> None:
    peer = Peer()
    peer.send(peer.call(1))
    peer.core.end_call(1, 5, "not found: ü\n")
    (frame,) = peer.read()
    assert frame.ends_stream and frame.fields[":status"] == "200"
    assert frame.fields["grpc-status"] == "5"
    assert frame.fields["grpc-message"] == "not found: %C3%BC%0A"


def test_a_zero_window_holds_the_answer_until_the_client_opens_it() -> None:
    peer = Peer(settings=[(f.SETTINGS_INITIAL_WINDOW_SIZE, 0)])
    peer.send(peer.call(1))
    peer.core.answer_unary(1, b"answer")
    assert [x.kind for x in peer.read()] == [f.HEADERS]  # DATA and trailers wait
    assert peer.core.pending_output(1) == 11
    peer.send(f.window_update_frame(1, 5))
    assert [len(x.payload) for x in peer.read()] == [5]
    events = peer.send(f.window_update_frame(1, 100))
    frames = peer.read()
    assert [x.kind for x in frames] == [f.DATA, f.HEADERS] and frames[1].ends_stream
    assert kinds(events) == ["WindowOpened"]


def test_the_connection_window_holds_responses_and_releases_them_in_order() -> None:
    peer = Peer()
    peer.send(peer.call(1), peer.call(3))
    peer.core.answer_unary(1, b"x" * 65_530)  # all of the connection's window
    peer.core.answer_unary(3, b"y" * 1000)
    assert [(x.kind, x.stream_id) for x in peer.read() if x.kind == f.DATA] == [(f.DATA, 1)] * 4
    peer.send(f.window_update_frame(0, 10_000))
    assert [x.stream_id for x in peer.read() if x.kind == f.DATA] == [3]


def test_a_large_response_is_cut_to_the_clients_max_frame_size() -> None:
    peer = Peer()
    peer.send(peer.call(1), f.window_update_frame(0, 100_000), f.window_update_frame(1, 100_000))
    peer.core.answer_unary(1, b"z" * 40_000)
    sizes = [len(x.payload) for x in peer.read() if x.kind == f.DATA]
    assert sizes == [16_384, 16_384, 40_005 - 32_768]


def test_graceful_drain_answers_open_calls_refuses_new_ones_then_closes() -> None:
    peer = Peer()
    peer.send(peer.headers(1))  # in flight: its body comes after the GOAWAY
    peer.core.drain()
    goaway = next(x for x in peer.read() if x.kind == f.GOAWAY)
    assert goaway.error_code == f.NO_ERROR and int.from_bytes(goaway.payload[:4], "big") == 1
    peer.send(peer.call(3))
    assert peer.reset_code(3) == f.REFUSED_STREAM
    (request,) = peer.send(peer.data(1, grpc_message(b"body")))
    assert isinstance(request, ev.UnaryRequest) and not peer.core.closing
    peer.core.answer_unary(1, b"ok")
    assert peer.core.closing  # the last call answered: the adapter closes after writing
    assert [x.kind for x in peer.read()] == [f.HEADERS, f.DATA, f.HEADERS]


def test_the_clients_goaway_closes_once_its_calls_are_answered() -> None:
    peer = Peer()
    peer.send(peer.call(1), f.goaway_frame(1, f.NO_ERROR, ""))
    assert not peer.core.closing
    peer.core.answer_unary(1, b"ok")
    assert peer.core.closing and peer.core.end_code == f.NO_ERROR


def test_the_adapter_resets_a_call() -> None:
    peer = Peer()
    peer.send(peer.headers(1, STREAM_PATH))
    peer.core.reset(1)
    assert peer.reset_code(1) == f.CANCEL
    assert peer.core.streams == {}


def test_an_unknown_method_is_unimplemented_trailers_only() -> None:
    peer = Peer()
    assert peer.send(peer.call(1, path="/nope.Service/Nothing")) == []
    (frame,) = peer.read()
    assert frame.ends_stream and grpc_status(frame) == 12
    assert frame.fields["grpc-message"] == "unknown method /nope.Service/Nothing"


def test_a_compressed_call_is_unimplemented_with_accept_encoding() -> None:
    peer = Peer()
    peer.send(peer.headers(1, extra=[("grpc-encoding", "gzip")]))
    (frame,) = peer.read()
    assert grpc_status(frame) == 12 and frame.fields["grpc-accept-encoding"] == "identity"


def test_a_compressed_message_without_grpc_encoding_is_internal() -> None:
    peer = Peer()
    peer.send(peer.headers(1), peer.data(1, b"\1" + grpc_message(b"x")[1:]))
    (frame,) = peer.read()
    assert grpc_status(frame) == 13 and "compressed" in frame.fields["grpc-message"]


def test_a_unary_call_without_a_message_is_internal() -> None:
    peer = Peer()
    peer.send(peer.headers(1, end_stream=True))
    (frame,) = peer.read()
    assert grpc_status(frame) == 13 and frame.ends_stream


def test_a_unary_call_with_two_messages_is_internal_and_reset() -> None:
    peer = Peer()
    two = grpc_message(b"a") + grpc_message(b"b")
    peer.send(peer.headers(1), peer.data(1, two, end_stream=False))
    frames = peer.read()
    assert grpc_status(frames[0]) == 13
    assert (frames[1].kind, frames[1].error_code) == (f.RST_STREAM, f.NO_ERROR)


def test_not_grpc_gets_an_http_status_with_a_body() -> None:
    peer = Peer()
    fields = [(":method", "GET"), (":scheme", "http"), (":path", UNARY_PATH), (":authority", "x")]
    peer.send(peer.headers(1, fields=fields, end_stream=True))
    headers, body = peer.read()
    assert headers.fields == {":status": "405", "content-type": "text/plain"}
    assert body.ends_stream and body.payload.startswith(b"405 Method Not Allowed")
    post = [(":method", "POST"), *fields[1:], ("content-type", "application/json")]
    peer.send(peer.headers(3, fields=post, end_stream=True))
    assert peer.read()[0].fields[":status"] == "415"


def test_a_refused_request_is_read_to_its_end_and_dropped() -> None:
    peer = Peer(Limits(connection_window=65_535 * 4))
    peer.send(peer.headers(1, path="/nope.Service/Nothing"))
    peer.read()
    peer.send(peer.data(1, b"x" * 1000, end_stream=False), peer.data(1, b"y" * 1000))
    assert peer.events == [] and peer.core.streams == {}
    assert peer.read() == []  # no RST_STREAM: the client ended its request itself


def test_streams_waiting_for_the_connection_window_take_turns() -> None:
    peer = Peer()
    peer.send(peer.call(1), peer.call(3), peer.call(5))
    peer.core.answer_unary(1, b"x" * 65_530)  # the whole connection window
    peer.core.answer_unary(3, b"y" * 1000)
    peer.core.answer_unary(5, b"z" * 1000)
    peer.read()
    served = []
    for _ in range(4):
        peer.send(f.window_update_frame(0, 100))
        served += [x.stream_id for x in peer.read() if x.kind == f.DATA]
    assert served == [3, 5, 3, 5]

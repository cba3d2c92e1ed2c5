"""The stream state table (states.py) against RFC 9113 §5.1, pair by pair, and what the core
does with each verdict."""

from __future__ import annotations

import pytest

from ratelimit_sidecar.grpc_server.protocol import events as ev
from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol import states as s
from tests.unit.grpc_server.protocol.peer import STREAM_PATH, Peer, connection_error, grpc_message

STREAM_TYPES = (f.DATA, f.HEADERS, f.PRIORITY, f.RST_STREAM, f.WINDOW_UPDATE)
CONNECTION_TYPES = (f.SETTINGS, f.PING, f.GOAWAY, f.PUSH_PROMISE, f.CONTINUATION)
PROTOCOL = s.CONNECTION_ERROR | f.PROTOCOL_ERROR


def test_the_table_covers_every_state_and_frame_type() -> None:
    pairs = {(state, kind) for state in range(len(s.STATE_NAMES)) for kind in range(f.FRAME_TYPES)}
    assert set(s.RULES) == pairs
    for (state, kind), verdict in s.RULES.items():
        assert s.RECEIVE[state][kind] == verdict
        assert verdict in (s.ACCEPT, s.IGNORE) or verdict & s.SCOPE in (
            s.STREAM_ERROR,
            s.CONNECTION_ERROR,
        )


@pytest.mark.parametrize("state", range(len(s.STATE_NAMES)))
def test_frames_of_the_connection_are_protocol_errors_on_any_stream(state: int) -> None:
    for kind in CONNECTION_TYPES:
        assert s.RULES[(state, kind)] == PROTOCOL, (s.STATE_NAMES[state], f.FRAME_NAMES[kind])


def test_idle_accepts_headers_and_priority_only() -> None:
    """§5.1 idle: anything but HEADERS or PRIORITY is a connection error PROTOCOL_ERROR."""
    verdicts = {kind: s.RULES[(s.IDLE, kind)] for kind in STREAM_TYPES}
    assert verdicts == {
        f.DATA: PROTOCOL, f.HEADERS: s.ACCEPT, f.PRIORITY: s.ACCEPT,
        f.RST_STREAM: PROTOCOL, f.WINDOW_UPDATE: PROTOCOL,
    }  # fmt: skip


@pytest.mark.parametrize("state", [s.OPEN, s.HALF_CLOSED_LOCAL])
def test_open_and_half_closed_local_accept_every_stream_frame(state: int) -> None:
    assert {s.RULES[(state, kind)] for kind in STREAM_TYPES} == {s.ACCEPT}


def test_half_closed_remote_accepts_only_window_update_priority_rst_stream() -> None:
    closed = s.STREAM_ERROR | f.STREAM_CLOSED
    verdicts = {kind: s.RULES[(s.HALF_CLOSED_REMOTE, kind)] for kind in STREAM_TYPES}
    assert verdicts == {
        f.DATA: closed, f.HEADERS: closed, f.PRIORITY: s.ACCEPT,
        f.RST_STREAM: s.ACCEPT, f.WINDOW_UPDATE: s.ACCEPT,
    }  # fmt: skip


def test_closed_allows_priority_and_ignores_late_window_update_and_rst_stream() -> None:
    verdicts = {kind: s.describe(s.RULES[(s.CLOSED, kind)]) for kind in STREAM_TYPES}
    assert verdicts == {
        f.DATA: "stream error STREAM_CLOSED", f.HEADERS: "connection error STREAM_CLOSED",
        f.PRIORITY: "accept", f.RST_STREAM: "ignore", f.WINDOW_UPDATE: "ignore",
    }  # fmt: skip


def test_closed_after_our_reset_drops_whatever_the_peer_had_sent() -> None:
    verdicts = {kind: s.RULES[(s.RESET_SENT, kind)] for kind in STREAM_TYPES}
    assert set(verdicts.values()) == {s.IGNORE, s.ACCEPT}
    assert verdicts[f.PRIORITY] == s.ACCEPT


def test_end_stream_transitions() -> None:
    assert s.AFTER_END_RECEIVED[s.OPEN] == s.HALF_CLOSED_REMOTE
    assert s.AFTER_END_RECEIVED[s.HALF_CLOSED_LOCAL] == s.CLOSED
    assert s.AFTER_END_SENT[s.OPEN] == s.HALF_CLOSED_LOCAL
    assert s.AFTER_END_SENT[s.HALF_CLOSED_REMOTE] == s.CLOSED


def test_closed_streams_remember_resets_up_to_their_capacity() -> None:
    closed = s.ClosedStreams(2)
    for stream_id in (1, 3, 5):
        closed.reset_sent(stream_id)
    assert [closed.state(i, newest=7) for i in (1, 3, 5, 7, 9, 2)] == [
        s.CLOSED, s.RESET_SENT, s.RESET_SENT, s.CLOSED, s.IDLE, s.IDLE,
    ]  # fmt: skip


def test_closed_streams_know_the_skipped_identifiers() -> None:
    closed = s.ClosedStreams(4)
    closed.skipped(3, 7)
    assert [closed.was_skipped(i) for i in (1, 3, 5, 7, 9)] == [False, True, True, True, False]


# -- the verdicts, applied ------------------------------------------------------------------


def open_unary(peer: Peer, stream_id: int = 1) -> None:
    """A unary call whose request arrived whole: half-closed (remote), held by the adapter."""
    events = peer.send(peer.call(stream_id))
    assert isinstance(events[0], ev.UnaryRequest)
    assert peer.core.streams[stream_id].state == s.HALF_CLOSED_REMOTE


def test_data_on_half_closed_remote_resets_the_stream_and_cancels_its_call() -> None:
    peer = Peer()
    open_unary(peer)
    events = peer.send(peer.data(1, grpc_message(b"again")))
    assert peer.reset_code(1) == f.STREAM_CLOSED
    assert [(type(e), e.stream_id) for e in events] == [(ev.StreamReset, 1)]  # type: ignore[union-attr]


def test_a_repeated_end_stream_never_starts_a_second_call() -> None:
    peer = Peer()
    open_unary(peer)
    peer.send(peer.data(1, b""), peer.headers(1, end_stream=True))
    assert not any(isinstance(event, ev.UnaryRequest) for event in peer.events)
    assert peer.reset_code(1) == f.STREAM_CLOSED


def test_headers_on_half_closed_remote_still_updates_the_hpack_table() -> None:
    peer = Peer()
    open_unary(peer)
    peer.send(peer.headers(1, extra=[("x-new", "indexed")]))  # adds to the dynamic table
    peer.send(peer.call(3, b"next", path="/test.Service/Unary"))
    peer.send(peer.headers(5, extra=[("x-new", "indexed")]), peer.data(5, grpc_message(b"x")))
    assert isinstance(peer.events[0], ev.UnaryRequest)
    assert (b"x-new", b"indexed") in peer.events[0].head.headers


def test_frames_on_a_stream_we_reset_are_dropped_but_counted_against_the_window() -> None:
    peer = Peer()
    peer.send(peer.headers(1))
    peer.core.reset(1)
    peer.read()
    window = peer.core.recv_window
    peer.send(peer.data(1, b"late" * 100, end_stream=False), peer.headers(1, end_stream=True))
    assert peer.read() == [] and not peer.core.closing
    assert peer.core.recv_window == window - 400


def test_priority_is_accepted_on_any_stream() -> None:
    peer = Peer()
    open_unary(peer)
    for stream_id in (1, 3, 99):
        dependency = (0).to_bytes(4, "big") + b"\x10"
        peer.send(f.frame(f.PRIORITY, 0, stream_id, dependency))
    assert peer.read() == [] and not peer.core.closing


def test_rst_stream_on_half_closed_remote_cancels_the_call() -> None:
    peer = Peer()
    open_unary(peer)
    events = peer.send(f.rst_stream_frame(1, f.CANCEL))
    assert isinstance(events[0], ev.StreamReset) and events[0].code == f.CANCEL
    peer.core.answer_unary(1, b"late answer")
    assert peer.read() == []  # a closed stream is not answered


def test_window_update_on_a_closed_stream_is_ignored() -> None:
    peer = Peer()
    open_unary(peer)
    peer.core.answer_unary(1, b"answer")
    peer.read()
    peer.send(f.window_update_frame(1, 100), f.rst_stream_frame(1, f.CANCEL))
    assert peer.read() == [] and not peer.core.closing


def test_headers_on_an_even_stream_is_a_connection_error() -> None:
    peer = Peer()
    peer.send(peer.headers(2))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_trailers_depending_on_their_own_stream_are_a_stream_error() -> None:
    peer = Peer()
    peer.send(peer.headers(1, STREAM_PATH))
    priority = (1).to_bytes(4, "big") + b"\x10"
    flags = f.END_HEADERS | f.END_STREAM | f.PRIORITY_FLAG
    events = peer.send(f.frame(f.HEADERS, flags, 1, priority + peer.block([("x-end", "1")])))
    assert peer.reset_code(1) == f.PROTOCOL_ERROR
    assert isinstance(events[0], ev.StreamReset)

"""Each bound of limits.py: the answer when it trips, and its count; time is the fake clock."""

from __future__ import annotations

import pytest

from ratelimit_sidecar.grpc_server.protocol import events as ev
from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol import output
from ratelimit_sidecar.grpc_server.protocol.limits import Limits
from ratelimit_sidecar.grpc_server.protocol.messages import MessageBudget
from ratelimit_sidecar.grpc_server.protocol.output import Output
from ratelimit_sidecar.grpc_server.protocol.stream import Stream
from tests.unit.grpc_server.protocol.peer import (
    STREAM_PATH,
    Peer,
    connection_error,
    grpc_message,
    grpc_status,
)

PING = f.frame(f.PING, 0, 0, b"keepaliv")


def statuses(peer: Peer) -> list[tuple[int, int]]:
    """(stream, grpc-status) of the trailers the core wrote."""
    return [(x.stream_id, grpc_status(x)) for x in peer.read() if "grpc-status" in x.fields]


# -- streams --------------------------------------------------------------------------------


def test_streams_over_the_advertised_limit_are_refused() -> None:
    peer = Peer(Limits(max_concurrent_streams=2))
    peer.send(peer.headers(1), peer.headers(3), peer.headers(5))
    assert peer.reset_code(5) == f.REFUSED_STREAM
    assert peer.counters.refused_streams == 1 and set(peer.core.streams) == {1, 3}
    peer.send(peer.data(1, grpc_message(b"m")))
    peer.core.answer_unary(1, b"ok")
    peer.send(peer.headers(7))  # a slot is free again
    assert set(peer.core.streams) == {3, 7}


@pytest.mark.skipif(
    str(output.__file__).endswith(".so"), reason="a compiled class's methods cannot be patched"
)
def test_one_settings_frame_moves_every_window_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """SETTINGS costs O(entries + streams): the entries are read, then the streams walked once
    (counted on the sources, which the compiled build is made of)."""
    peer = Peer()
    peer.send(*(peer.headers(1 + 2 * i) for i in range(100)))
    calls: list[int] = []
    walk = Output.initial_window_changed

    def counted(output: Output, streams: list[Stream], peak: int, final: int) -> None:
        calls.append(len(streams))
        walk(output, streams, peak, final)

    monkeypatch.setattr(Output, "initial_window_changed", counted)
    entries = [(f.SETTINGS_INITIAL_WINDOW_SIZE, 1000 + i) for i in range(500)]
    peer.send(f.settings_frame(entries))
    assert calls == [100]
    assert {stream.send_window for stream in peer.core.streams.values()} == {1499}


def test_initial_window_pushing_a_stream_window_over_2_31_is_a_connection_error() -> None:
    """§6.9.2: FLOW_CONTROL_ERROR, whichever value of the frame does it."""
    peer = Peer()
    peer.send(peer.headers(1), f.window_update_frame(1, f.MAX_WINDOW - f.DEFAULT_WINDOW - 10))
    values = [(f.SETTINGS_INITIAL_WINDOW_SIZE, f.DEFAULT_WINDOW + 20)]
    peer.send(f.settings_frame([*values, (f.SETTINGS_INITIAL_WINDOW_SIZE, 0)]))
    connection_error(peer, f.FLOW_CONTROL_ERROR)


def test_data_over_the_stream_window_is_a_stream_error() -> None:
    peer = Peer(Limits(stream_window=100), settings=[])
    peer.send(peer.headers(1), peer.data(1, b"\0" + (500).to_bytes(4, "big") + b"x" * 300, False))
    assert peer.reset_code(1) == f.FLOW_CONTROL_ERROR


def test_data_over_the_connection_window_is_a_connection_error() -> None:
    peer = Peer()
    big = grpc_message(b"x" * 3_000_000)
    frames = [big[i : i + 16_384] for i in range(0, len(big), 16_384)]
    peer.send(
        *(peer.headers(1 + 2 * i) for i in range(40)),
        *(peer.data(1 + 2 * (i // 4), chunk, False) for i, chunk in enumerate(frames[:80])),
    )
    connection_error(peer, f.FLOW_CONTROL_ERROR)


# -- messages -------------------------------------------------------------------------------


def test_a_message_over_the_largest_is_refused_at_its_prefix() -> None:
    peer = Peer(Limits(max_message_bytes=1000))
    peer.send(peer.headers(1), peer.data(1, b"\0" + (1001).to_bytes(4, "big") + b"x", False))
    assert statuses(peer) == [(1, 8)]
    assert peer.counters.messages_too_large == 1 and peer.core.streams == {}


def test_partial_messages_past_the_budget_are_refused_across_connections() -> None:
    budget = MessageBudget(100_000)
    first, second = Peer(budget=budget), Peer(budget=budget)
    half = grpc_message(b"x" * 60_000)[:15_000]
    first.send(first.headers(1), first.data(1, half, False))
    assert budget.used == 60_005
    second.send(second.headers(1), second.data(1, half, False))
    assert statuses(second) == [(1, 8)]
    assert second.counters.budget_refusals == 1 and budget.refusals == 1
    first.core.connection_lost()
    assert budget.used == 0


def test_a_whole_message_in_one_frame_takes_no_budget() -> None:
    budget = MessageBudget(10)
    peer = Peer(budget=budget)
    (request,) = peer.send(peer.call(1, b"x" * 1000))
    assert isinstance(request, ev.UnaryRequest) and budget.used == 0


def test_a_streaming_backlog_waits_in_flow_control_until_consumed() -> None:
    """Messages the adapter has not consumed hold the stream's window: no WINDOW_UPDATE."""
    peer = Peer()
    peer.send(peer.headers(1, STREAM_PATH))
    message = grpc_message(b"r" * 10_000)
    peer.send(*(peer.data(1, message, False) for _ in range(6)))
    assert [x for x in peer.read() if x.kind == f.WINDOW_UPDATE] == []
    assert peer.core.streams[1].recv_window == f.DEFAULT_WINDOW - 60_030
    for _ in range(4):
        peer.core.message_consumed(1)
    updates = [x for x in peer.read() if x.kind == f.WINDOW_UPDATE and x.stream_id == 1]
    assert sum(int.from_bytes(x.payload, "big") for x in updates) == 40_020


def test_stream_credit_waits_while_the_budget_is_full() -> None:
    budget = MessageBudget(100_000)
    peer = Peer(budget=budget)
    peer.send(peer.headers(1, STREAM_PATH))
    peer.send(*(peer.data(1, grpc_message(b"r" * 10_000), False) for _ in range(4)))
    budget.used = budget.capacity  # another connection's messages fill it
    for _ in range(4):
        peer.core.message_consumed(1)
    assert [x for x in peer.read() if x.kind == f.WINDOW_UPDATE and x.stream_id == 1] == []
    assert peer.core.next_timer() is not None
    budget.used = 0
    peer.tick(0.1)
    assert [x.stream_id for x in peer.read() if x.kind == f.WINDOW_UPDATE] == [1]


# -- time -------------------------------------------------------------------------------------


def test_a_unary_request_not_whole_in_time_ends_deadline_exceeded() -> None:
    peer = Peer()
    peer.send(peer.headers(1), peer.data(1, grpc_message(b"x" * 10)[:8], False))
    assert peer.core.next_timer() == 10.0
    assert peer.tick(9.9) == []
    assert peer.tick(0.2) == []  # the adapter never held it
    frames = peer.read()
    assert (
        grpc_status(frames[0]) == 4
        and "did not arrive within 10 s" in frames[0].fields["grpc-message"]
    )
    assert (frames[1].kind, frames[1].error_code) == (f.RST_STREAM, f.NO_ERROR)
    assert peer.counters.receive_timeouts == 1 and peer.budget.used == 0


def test_a_streaming_call_idle_too_long_ends_and_is_cancelled() -> None:
    peer = Peer()
    peer.send(peer.headers(1, STREAM_PATH))
    peer.tick(200.0)
    peer.send(peer.data(1, grpc_message(b"report"), False))  # the idle clock starts again
    assert peer.tick(299.0) == []
    (reset,) = peer.tick(2.0)
    assert isinstance(reset, ev.StreamReset) and reset.stream_id == 1
    assert statuses(peer) == [(1, 4)] and peer.counters.closed_idle_streams == 1


def test_a_half_closed_streaming_call_never_idles_out() -> None:
    """A server-streaming call (health Watch): the client sent all it had."""
    peer = Peer()
    peer.send(peer.headers(1, STREAM_PATH), peer.data(1, grpc_message(b"watch")))
    peer.tick(10_000.0)
    assert 1 in peer.core.streams and peer.core.next_timer() is None


def test_a_grpc_timeout_ends_a_call_the_adapter_holds() -> None:
    peer = Peer()
    peer.send(peer.headers(1, extra=[("grpc-timeout", "20m")]), peer.data(1, grpc_message(b"")))
    assert peer.core.next_timer() == pytest.approx(0.02)
    (reset,) = peer.tick(0.03)
    assert isinstance(reset, ev.StreamReset) and reset.reason == "deadline exceeded"
    assert statuses(peer) == [(1, 4)] and peer.counters.deadlines == 1
    peer.core.answer_unary(1, b"too late")
    assert peer.read() == []


def test_a_call_answered_in_its_read_arms_no_timer() -> None:
    peer = Peer()
    peer.send(f.frame(f.SETTINGS, f.ACK, 0))
    peer.send(peer.headers(1, extra=[("grpc-timeout", "20m")]), peer.data(1, grpc_message(b"")))
    peer.core.answer_unary(1, b"ok")
    assert peer.core.timers.next_due(peer.core.streams) == float("inf")


def test_no_preface_in_time_is_protocol_error() -> None:
    peer = Peer(handshake=False)
    peer.send(f.PREFACE[:10])
    peer.tick(10.0)
    connection_error(peer, f.PROTOCOL_ERROR)
    assert peer.counters.handshake_timeouts == 1


def test_the_preface_followed_by_ping_is_protocol_error() -> None:
    peer = Peer(handshake=False)
    peer.send(f.PREFACE, PING)
    connection_error(peer, f.PROTOCOL_ERROR)


def test_the_preface_followed_by_a_settings_ack_is_protocol_error() -> None:
    peer = Peer(handshake=False)
    peer.send(f.PREFACE, f.frame(f.SETTINGS, f.ACK, 0))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_our_settings_not_acknowledged_in_time_is_settings_timeout() -> None:
    peer = Peer(handshake=False)
    peer.send(f.PREFACE, f.settings_frame([]))
    peer.tick(10.0)
    connection_error(peer, f.SETTINGS_TIMEOUT)
    assert peer.counters.settings_timeouts == 1


# -- the control-frame budget ------------------------------------------------------------------


def test_a_ping_flood_is_enhance_your_calm_too_many_pings() -> None:
    peer = Peer()
    peer.send(PING * 2_100)
    connection_error(peer, f.ENHANCE_YOUR_CALM)
    assert peer.core.end_reason == "too_many_pings" and peer.counters.control_floods == 1


@pytest.mark.parametrize(
    "frame",
    [
        f.settings_frame([]),
        f.frame(f.PRIORITY, 0, 1, b"\0\0\0\0\x10"),
        f.frame(0x42, 0, 0, b"unknown"),
        f.window_update_frame(0, 1),
    ],
    ids=["settings", "priority", "unknown", "window_update"],
)
def test_a_control_frame_flood_is_enhance_your_calm(frame: bytes) -> None:
    peer = Peer()
    peer.send(frame * 2_100)
    connection_error(peer, f.ENHANCE_YOUR_CALM)


def test_rapid_reset_is_enhance_your_calm() -> None:
    peer = Peer()
    streams = range(1, 4_400, 2)
    peer.send(b"".join(peer.headers(i) + f.rst_stream_frame(i, f.CANCEL) for i in streams))
    connection_error(peer, f.ENHANCE_YOUR_CALM)


def test_keepalive_pings_never_trip_the_budget() -> None:
    """A PING every 10 s for a day, and one a second for an hour, beside the calls."""
    peer = Peer()
    for _ in range(8_640):
        peer.now += 10.0
        peer.send(PING)
    for _ in range(3_600):
        peer.now += 1.0
        peer.send(PING)
    assert not peer.core.closing and peer.counters.control_floods == 0


def test_answered_calls_earn_no_tokens() -> None:
    """Interleaving requests with the flood does not refill the bucket."""
    peer = Peer()
    for stream_id in range(1, 400, 2):
        peer.send(PING * 10, peer.call(stream_id))
        for event in peer.events:
            if isinstance(event, ev.UnaryRequest):
                peer.core.answer_unary(event.stream_id, b"ok")
        if peer.core.closing:
            break
    assert peer.core.closing and peer.core.end_reason == "too_many_pings"


def test_tokens_come_back_with_time() -> None:
    peer = Peer()
    burst, per_s = Limits().chatter_frames_burst, Limits().chatter_frames_per_s
    peer.send(PING * (burst - 10))
    peer.now += burst / per_s
    peer.send(PING * (burst - 10))
    assert not peer.core.closing


@pytest.mark.parametrize("frame", [PING, f.settings_frame([])], ids=["ping", "settings"])
def test_chatter_between_calls_at_a_modest_rate_still_trips(frame: bytes) -> None:
    """A frame with each of 100 calls a second: above the chatter rate, the calls earn nothing."""
    peer = Peer()
    for stream_id in range(1, 20_000, 2):
        peer.now += 0.01
        peer.send(frame, peer.call(stream_id))
        for event in peer.events:
            if isinstance(event, ev.UnaryRequest):
                peer.core.answer_unary(event.stream_id, b"ok")
        if peer.core.closing:
            break
    assert peer.core.closing and peer.core.end_code == f.ENHANCE_YOUR_CALM


def test_a_window_update_with_every_answer_is_no_flood() -> None:
    """grpc's C-core client credits each answer it reads: a WINDOW_UPDATE per call, for ever."""
    peer = Peer()
    for stream_id in range(1, 8_000, 2):
        peer.now += 0.001
        peer.send(peer.call(stream_id, b"x"))
        for event in peer.events:
            if isinstance(event, ev.UnaryRequest):
                peer.core.answer_unary(event.stream_id, b"y" * 20)
        peer.send(f.window_update_frame(0, 25))
    assert not peer.core.closing and peer.counters.control_floods == 0


# -- sizes and turns ---------------------------------------------------------------------------


def test_headers_over_the_advertised_list_size_get_resource_exhausted() -> None:
    peer = Peer()
    peer.send(peer.headers(1, extra=[("x-big", "v" * 20_000)], end_stream=True))
    (frame,) = peer.read()
    assert grpc_status(frame) == 8 and "headers over the limit" in frame.fields["grpc-message"]
    assert peer.counters.header_lists_too_large == 1
    peer.send(peer.call(3))
    assert isinstance(peer.events[0], ev.UnaryRequest)  # the connection goes on


def test_a_continuation_flood_is_enhance_your_calm() -> None:
    peer = Peer()
    chunk = f.frame(f.CONTINUATION, 0, 1, b"\0" * 16_000)
    peer.send(f.frame(f.HEADERS, 0, 1, peer.block([(":method", "POST")])), chunk * 5)
    connection_error(peer, f.ENHANCE_YOUR_CALM)
    assert peer.counters.header_blocks_too_large == 1


def test_a_block_decoding_past_the_hard_bound_is_enhance_your_calm() -> None:
    """A few octets that index one large table entry again and again."""
    peer = Peer()
    peer.send(peer.headers(1, extra=[("x-large", "v" * 4_000)], end_stream=True))
    block = peer.block([("x-large", "v" * 4_000)] * 20)
    assert len(block) < 100
    peer.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 3, block))
    connection_error(peer, f.ENHANCE_YOUR_CALM)


def test_a_frame_over_max_frame_size_is_frame_size_error() -> None:
    peer = Peer()
    peer.send(f.frame(0x42, 0, 0, b"x" * 16_385))
    connection_error(peer, f.FRAME_SIZE_ERROR)
    assert peer.counters.frames_too_large == 1


def test_a_turn_stops_after_frames_per_turn_and_resumes_on_empty_receive() -> None:
    peer = Peer(Limits(frames_per_turn=100, chatter_frames_burst=1_000))
    peer.send(PING * 250, every_turn=False)
    assert peer.core.backlogged and len(peer.read()) == 100
    peer.send(b"", every_turn=False)
    assert peer.core.backlogged and len(peer.read()) == 100
    peer.send(b"", every_turn=False)
    assert not peer.core.backlogged and len(peer.read()) == 50
    assert peer.counters.turns_cut == 2


def test_the_connection_window_advertised_and_credited_in_quarters() -> None:
    peer = Peer(handshake=False)
    update = peer.server_frames[1]
    assert (update.kind, int.from_bytes(update.payload, "big")) == (
        f.WINDOW_UPDATE,
        Limits().connection_window - f.DEFAULT_WINDOW,
    )
    peer.send(f.PREFACE, f.settings_frame([]), f.frame(f.SETTINGS, f.ACK, 0))
    message = b"x" * 16_000
    for stream_id in range(1, 34, 2):
        peer.send(peer.call(stream_id, message))
    credits = [x for x in peer.read() if x.kind == f.WINDOW_UPDATE and x.stream_id == 0]
    assert len(credits) == 1 and int.from_bytes(credits[0].payload, "big") >= 2**18


def test_late_frames_on_forgotten_resets_get_stream_closed() -> None:
    peer = Peer(Limits(remembered_resets=2))
    for stream_id in (1, 3, 5):
        peer.send(peer.headers(stream_id))
        peer.core.reset(stream_id)
    peer.read()
    peer.send(peer.data(3, b"late", False), peer.data(1, b"late", False))
    assert [(x.kind, x.stream_id) for x in peer.read()] == [(f.RST_STREAM, 1)]


def test_the_window_of_frames_ending_in_errors_comes_back() -> None:
    """A stream error or a refused message ends its stream, not the connection's window."""
    peer = Peer(Limits(connection_window=65_535, max_message_bytes=100))
    too_large = b"\0" + (5_000).to_bytes(4, "big") + b"x" * 15_995
    for stream_id in range(1, 40, 2):
        if stream_id % 4 == 1:  # the DATA does not add up to the content-length
            sent = peer.headers(stream_id, extra=[("content-length", "1")])
        else:
            sent = peer.headers(stream_id)
        peer.send(sent, peer.data(stream_id, too_large))
        assert not peer.core.closing
    assert peer.counters.stream_errors == 10 and peer.counters.messages_too_large == 10
    assert peer.core.recv_window + peer.core.credit == 65_535


def test_the_budget_is_whole_again_after_calls_that_fail() -> None:
    budget = MessageBudget(1 << 20)
    peer = Peer(Limits(max_message_bytes=1000), budget=budget)
    spanning = grpc_message(b"a" * 500)
    two = spanning + grpc_message(b"b" * 500)
    peer.send(peer.headers(1), peer.data(1, spanning[:100], False), peer.data(1, two[100:], False))
    assert statuses(peer) == [(1, 13)]  # a unary call with two messages
    too_large = spanning + b"\0" + (5000).to_bytes(4, "big")
    peer.send(peer.headers(3, STREAM_PATH), peer.data(3, too_large[:100], False))
    peer.send(peer.data(3, too_large[100:], False))
    assert statuses(peer) == [(3, 8)]
    peer.send(peer.headers(5), peer.data(5, spanning[:50], False))
    peer.core.reset(5)
    assert budget.used == 0 and peer.core.streams == {}


def test_sixteen_connections_of_sixteen_large_messages_buffer_within_the_budget() -> None:
    """Today's loop buffers 16 x 16 x 4 MiB; the budget admits what it has room for and the
    rest are refused as their first octets arrive."""
    budget = MessageBudget(8 * (4 * 1024 * 1024 + 5))  # room for eight
    first_frame = b"\0" + (4 * 1024 * 1024).to_bytes(4, "big") + b"m" * 16_379
    peers = [Peer(budget=budget) for _ in range(16)]
    for peer in peers:
        opened = (
            peer.headers(1 + 2 * i) + peer.data(1 + 2 * i, first_frame, False) for i in range(16)
        )
        peer.send(*opened)
    assert budget.used == 8 * (4 * 1024 * 1024 + 5)
    assert sum(peer.counters.budget_refusals for peer in peers) == 256 - 8
    buffered = sum(
        len(stream.reader.buffer) for peer in peers for stream in peer.core.streams.values()
        if stream.reader is not None
    )  # fmt: skip
    assert buffered == 8 * 16_384


def test_a_whole_message_over_the_largest_is_refused_too() -> None:
    peer = Peer(Limits(max_message_bytes=100))
    peer.send(peer.call(1, b"x" * 101), peer.headers(3, STREAM_PATH))
    peer.send(peer.data(3, grpc_message(b"y" * 101), False))
    assert statuses(peer) == [(1, 8), (3, 8)] and peer.counters.messages_too_large == 2
    assert not [event for event in peer.events if isinstance(event, ev.Message)]

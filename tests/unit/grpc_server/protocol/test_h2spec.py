"""h2spec's cases (summerwind/h2spec, numbered by RFC 7540's sections as h2spec numbers them),
each sent to the core as h2spec sends it: its plain GET / request, answered 405 by a gRPC server,
and the frames around it. Where RFC 9113 changed a rule, 9113's answer is asserted. h2spec's
verdict is in each docstring: a stream error passes on RST_STREAM or GOAWAY with the code, a
connection error on GOAWAY with the code (or a close)."""

from __future__ import annotations

import hpack
import pytest

from ratelimit_sidecar.grpc_server.protocol import events as ev
from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol.limits import Limits
from tests.unit.grpc_server.protocol.peer import Frame, Peer, connection_error, stream_error

GET = [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "localhost")]
POST = [(":method", "POST"), *GET[1:]]
PING_DATA = b"h2spec\0\0"
DUMMY = [("x-dummy0", "dummy")]


def request(
    peer: Peer, stream_id: int = 1, end_stream: bool = True, fields: list[tuple[str, str]] = GET
) -> bytes:
    return peer.headers(stream_id, end_stream=end_stream, fields=fields)


def ping(payload: bytes = PING_DATA, flags: int = 0, stream_id: int = 0) -> bytes:
    return f.frame(f.PING, flags, stream_id, payload)


def ping_acked(peer: Peer, payload: bytes = PING_DATA) -> None:
    frames = [frame for frame in peer.read() if frame.kind == f.PING]
    assert [(frame.flags, frame.payload) for frame in frames][-1] == (f.ACK, payload)
    assert not peer.core.closing


def answered(peer: Peer, stream_id: int = 1) -> Frame:
    """The response's HEADERS on `stream_id` (405 for h2spec's GET)."""
    frames = [x for x in peer.read() if x.kind == f.HEADERS and x.stream_id == stream_id]
    assert frames, f"no response on stream {stream_id}"
    assert not peer.core.closing
    return frames[0]


def continuation(stream_id: int, block: bytes, end_headers: bool = True) -> bytes:
    return f.frame(f.CONTINUATION, f.END_HEADERS if end_headers else 0, stream_id, block)


def open_block(peer: Peer, stream_id: int = 1) -> bytes:
    """HEADERS without END_HEADERS: a header block to be continued."""
    return f.frame(f.HEADERS, 0, stream_id, peer.block(GET))


def priority(stream_id: int, depends_on: int, weight: int = 15, exclusive: bool = False) -> bytes:
    dependency = depends_on | (0x80000000 if exclusive else 0)
    return f.frame(f.PRIORITY, 0, stream_id, dependency.to_bytes(4, "big") + bytes((weight,)))


def window_update(stream_id: int, increment: int) -> bytes:
    return f.frame(f.WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))


def settings(*values: tuple[int, int]) -> bytes:
    return f.settings_frame(list(values))


def data_frames(peer: Peer, stream_id: int = 1) -> list[Frame]:
    return [x for x in peer.read() if x.kind == f.DATA and x.stream_id == stream_id]


# -- 3.5 HTTP/2 Connection Preface ------------------------------------------------------------


def test_h2spec_3_5_1_client_preface_gets_settings_first() -> None:
    peer = Peer(handshake=False)
    assert peer.server_frames[0].kind == f.SETTINGS and not peer.server_frames[0].flags


def test_h2spec_3_5_2_invalid_preface() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer(handshake=False)
    peer.send(b"INVALID CONNECTION PREFACE\r\n\r\n")
    connection_error(peer, f.PROTOCOL_ERROR)


# -- 4 HTTP Frames ----------------------------------------------------------------------------


def test_h2spec_4_1_1_unknown_frame_type_ignored() -> None:
    peer = Peer()
    peer.send(f.frame(0x16, 0, 0, b"0" * 8), ping())
    ping_acked(peer)


def test_h2spec_4_1_2_undefined_flag_ignored() -> None:
    peer = Peer()
    peer.send(ping(flags=0x16))
    ping_acked(peer)


def test_h2spec_4_1_3_reserved_bit_ignored() -> None:
    peer = Peer()
    peer.send(f.frame(f.PING, 0, 0x80000000, PING_DATA))
    ping_acked(peer)


def test_h2spec_4_2_1_data_of_2_14_octets() -> None:
    peer = Peer()
    peer.send(request(peer, end_stream=False, fields=POST), peer.data(1, b"x" * 16_384))
    assert answered(peer).fields[":status"] == "415"


def test_h2spec_4_2_2_data_over_max_frame_size() -> None:
    """Stream error FRAME_SIZE_ERROR, as a connection error (§4.2 allows either)."""
    peer = Peer()
    peer.send(request(peer, end_stream=False, fields=POST), peer.data(1, b"x" * 16_385))
    connection_error(peer, f.FRAME_SIZE_ERROR)


def test_h2spec_4_2_3_headers_over_max_frame_size() -> None:
    """Connection error FRAME_SIZE_ERROR."""
    peer = Peer()
    fields = [*GET, *((f"x-dummy{i}", "x" * 1000) for i in range(17))]
    block = hpack.Encoder().encode(fields, huffman=False)
    peer.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, block))
    connection_error(peer, f.FRAME_SIZE_ERROR)


def test_h2spec_4_3_1_invalid_header_block() -> None:
    """Connection error COMPRESSION_ERROR."""
    peer = Peer()
    peer.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, b"\x40"))
    connection_error(peer, f.COMPRESSION_ERROR)


def test_h2spec_4_3_2_priority_inside_a_header_block() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(open_block(peer), priority(1, 0), continuation(1, peer.block(DUMMY)))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_4_3_3_headers_of_another_stream_inside_a_header_block() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(open_block(peer), request(peer, 3), continuation(1, peer.block(DUMMY)))
    connection_error(peer, f.PROTOCOL_ERROR)


# -- 5 Streams and Multiplexing -----------------------------------------------------------------


def test_h2spec_5_1_1_1_stream_id_even() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(request(peer, 2))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_5_1_1_2_stream_id_smaller_than_previous() -> None:
    """Connection error PROTOCOL_ERROR (stream 3 was skipped, never opened: §5.1.1)."""
    peer = Peer()
    peer.send(request(peer, 5), request(peer, 3))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_5_1_2_1_concurrent_stream_limit_exceeded() -> None:
    """Stream error PROTOCOL_ERROR or REFUSED_STREAM: the 405s wait for window, so every stream
    stays open, and the one past the advertised limit is refused."""
    peer = Peer(Limits(max_concurrent_streams=8))
    assert dict(f.settings_entries(peer.server_frames[0].payload))[3] == 8
    peer.send(settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 0)))
    peer.send(b"".join(request(peer, 1 + 2 * i) for i in range(9)))
    stream_error(peer, 17, f.REFUSED_STREAM)


def test_h2spec_5_1_1_idle_data() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(peer.data(1, b"test"))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_5_1_2_idle_rst_stream() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(f.rst_stream_frame(1, f.CANCEL))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_5_1_3_idle_window_update() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(window_update(1, 100))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_5_1_4_idle_continuation() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(continuation(1, peer.block(GET)))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_5_1_5_half_closed_remote_data() -> None:
    """Stream error STREAM_CLOSED (the 405 is out, so the stream is closed by then: the same
    answer, §6.1)."""
    peer = Peer()
    peer.send(request(peer), peer.data(1, b"test"))
    stream_error(peer, 1, f.STREAM_CLOSED)


def test_h2spec_5_1_6_half_closed_remote_headers() -> None:
    """Stream error STREAM_CLOSED; the stream is closed by then: connection error STREAM_CLOSED."""
    peer = Peer()
    peer.send(request(peer), request(peer))
    connection_error(peer, f.STREAM_CLOSED)


def test_h2spec_5_1_7_half_closed_remote_continuation() -> None:
    """Stream error STREAM_CLOSED or PROTOCOL_ERROR: no header block is open."""
    peer = Peer()
    peer.send(request(peer), continuation(1, peer.block(DUMMY)))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_5_1_8_closed_data_after_rst_stream() -> None:
    """Stream error STREAM_CLOSED."""
    peer = Peer()
    peer.send(request(peer, end_stream=False), f.rst_stream_frame(1, f.CANCEL))
    peer.send(peer.data(1, b"test"))
    stream_error(peer, 1, f.STREAM_CLOSED)


def test_h2spec_5_1_9_closed_headers_after_rst_stream() -> None:
    """Stream error STREAM_CLOSED (RFC 9113 §5.1 allows the connection error)."""
    peer = Peer()
    peer.send(request(peer, end_stream=False), f.rst_stream_frame(1, f.CANCEL))
    peer.send(request(peer))
    connection_error(peer, f.STREAM_CLOSED)


def test_h2spec_5_1_10_closed_continuation_after_rst_stream() -> None:
    """Stream error STREAM_CLOSED or PROTOCOL_ERROR: no header block is open."""
    peer = Peer()
    peer.send(request(peer, end_stream=False), f.rst_stream_frame(1, f.CANCEL))
    peer.send(continuation(1, peer.block(DUMMY)))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_5_1_11_closed_data() -> None:
    """Stream error STREAM_CLOSED (§6.1)."""
    peer = Peer()
    peer.send(request(peer))
    assert data_frames(peer)[-1].ends_stream  # the 405 is complete: closed
    peer.send(peer.data(1, b"test"))
    stream_error(peer, 1, f.STREAM_CLOSED)


def test_h2spec_5_1_12_closed_headers() -> None:
    """Connection error STREAM_CLOSED."""
    peer = Peer()
    peer.send(request(peer))
    peer.read()
    peer.send(request(peer))
    connection_error(peer, f.STREAM_CLOSED)


def test_h2spec_5_1_13_closed_continuation() -> None:
    """Connection error STREAM_CLOSED or PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(request(peer))
    peer.read()
    peer.send(continuation(1, peer.block(DUMMY)))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_5_3_1_1_headers_depending_on_itself() -> None:
    """Stream error PROTOCOL_ERROR."""
    peer = Peer()
    dependency = (1).to_bytes(4, "big") + b"\x0f"
    flags = f.END_HEADERS | f.END_STREAM | f.PRIORITY_FLAG
    peer.send(f.frame(f.HEADERS, flags, 1, dependency + peer.block(GET)))
    stream_error(peer, 1, f.PROTOCOL_ERROR)


def test_h2spec_5_3_1_2_priority_depending_on_itself() -> None:
    """PROTOCOL_ERROR: h2spec takes a stream or a connection error; on an idle stream, which a
    PRIORITY does not open, only a connection error keeps RST_STREAM off it (§6.4)."""
    peer = Peer()
    peer.send(priority(1, 1, 255))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_5_4_1_1_invalid_ping_closes_the_connection() -> None:
    peer = Peer()
    peer.send(ping(stream_id=3))
    assert peer.core.closing


def test_h2spec_5_4_1_2_invalid_ping_gets_goaway() -> None:
    """GOAWAY PROTOCOL_ERROR before the close."""
    peer = Peer()
    peer.send(ping(stream_id=3))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_5_5_1_unknown_extension_frame() -> None:
    peer = Peer()
    peer.send(f.frame(0xFF, 0, 0, b"extension"), ping())
    ping_acked(peer)


def test_h2spec_5_5_2_unknown_extension_frame_inside_a_header_block() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(open_block(peer), f.frame(0xFF, 0, 1, b"x"), continuation(1, peer.block(DUMMY)))
    connection_error(peer, f.PROTOCOL_ERROR)


# -- 6 Frame Definitions ----------------------------------------------------------------------


def test_h2spec_6_1_1_data_on_stream_0() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(peer.data(0, b"test"))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_1_2_data_on_a_stream_not_open() -> None:
    """Stream error STREAM_CLOSED."""
    peer = Peer()
    peer.send(request(peer), peer.data(1, b"test"))
    stream_error(peer, 1, f.STREAM_CLOSED)


def test_h2spec_6_1_3_data_with_invalid_pad_length() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    padded = f.frame(f.DATA, f.PADDED | f.END_STREAM, 1, b"\x06Test")
    peer.send(request(peer, end_stream=False, fields=POST), padded)
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_2_1_headers_without_end_headers_then_priority() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(open_block(peer), priority(1, 0), continuation(1, peer.block(DUMMY)))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_2_2_headers_of_another_stream_during_a_header_block() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(open_block(peer), request(peer, 3), continuation(1, peer.block(DUMMY)))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_2_3_headers_on_stream_0() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(request(peer, 0))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_2_4_headers_with_invalid_pad_length() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    block = peer.block(GET)
    payload = bytes((len(block) + 2,)) + block
    peer.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM | f.PADDED, 1, payload))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_3_1_priority_on_stream_0() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(priority(0, 1))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_3_2_priority_not_of_5_octets() -> None:
    """Stream error FRAME_SIZE_ERROR."""
    peer = Peer()
    peer.send(request(peer), f.frame(f.PRIORITY, 0, 1, b"\x80\x00\x00\x01"))
    stream_error(peer, 1, f.FRAME_SIZE_ERROR)


def test_h2spec_6_4_1_rst_stream_on_stream_0() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(f.rst_stream_frame(0, f.CANCEL))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_4_2_rst_stream_on_an_idle_stream() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(f.rst_stream_frame(1, f.CANCEL))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_4_3_rst_stream_not_of_4_octets() -> None:
    """Connection error FRAME_SIZE_ERROR."""
    peer = Peer()
    peer.send(request(peer), f.frame(f.RST_STREAM, 0, 1, b"\0\0\0"))
    connection_error(peer, f.FRAME_SIZE_ERROR)


def test_h2spec_6_5_2_1_enable_push_not_0_or_1() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(settings((f.SETTINGS_ENABLE_PUSH, 2)))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_5_2_2_initial_window_size_over_the_maximum() -> None:
    """Connection error FLOW_CONTROL_ERROR."""
    peer = Peer()
    peer.send(settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 2**31)))
    connection_error(peer, f.FLOW_CONTROL_ERROR)


def test_h2spec_6_5_2_3_max_frame_size_below_the_initial_value() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(settings((f.SETTINGS_MAX_FRAME_SIZE, 16_383)))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_5_2_4_max_frame_size_over_the_maximum() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(settings((f.SETTINGS_MAX_FRAME_SIZE, 2**24)))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_5_2_5_unknown_setting_ignored() -> None:
    peer = Peer()
    peer.send(settings((0xFF, 1)), ping())
    ping_acked(peer)


def test_h2spec_6_5_3_1_settings_values_in_order() -> None:
    """The last SETTINGS_INITIAL_WINDOW_SIZE of a frame wins: DATA of 1 octet."""
    peer = Peer()
    values = ((f.SETTINGS_INITIAL_WINDOW_SIZE, 100), (f.SETTINGS_INITIAL_WINDOW_SIZE, 1))
    peer.send(settings(*values), request(peer))
    assert [len(frame.payload) for frame in data_frames(peer)] == [1]


def test_h2spec_6_5_3_2_settings_acknowledged() -> None:
    peer = Peer()
    peer.send(settings())
    assert [(x.kind, x.flags, x.payload) for x in peer.read()] == [(f.SETTINGS, f.ACK, b"")]


def test_h2spec_6_5_1_settings_ack_with_a_payload() -> None:
    """Connection error FRAME_SIZE_ERROR."""
    peer = Peer()
    peer.send(f.frame(f.SETTINGS, f.ACK, 0, b"\0\x01\0\0\x10\0"))
    connection_error(peer, f.FRAME_SIZE_ERROR)


def test_h2spec_6_5_2_settings_on_a_stream() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(f.frame(f.SETTINGS, 0, 1, b"\0\x01\0\0\x10\0"))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_5_3_settings_not_a_multiple_of_6_octets() -> None:
    """Connection error FRAME_SIZE_ERROR."""
    peer = Peer()
    peer.send(f.frame(f.SETTINGS, 0, 0, b"\0\x01\0\0\x10"))
    connection_error(peer, f.FRAME_SIZE_ERROR)


def test_h2spec_6_7_1_ping() -> None:
    peer = Peer()
    peer.send(ping())
    ping_acked(peer)


def test_h2spec_6_7_2_ping_ack_not_answered() -> None:
    peer = Peer()
    peer.send(ping(b"unknown\0", flags=f.ACK), ping())
    ping_acked(peer)


def test_h2spec_6_7_3_ping_on_a_stream() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(ping(stream_id=1))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_7_4_ping_not_of_8_octets() -> None:
    """Connection error FRAME_SIZE_ERROR."""
    peer = Peer()
    peer.send(ping(b"123456"))
    connection_error(peer, f.FRAME_SIZE_ERROR)


def test_h2spec_6_8_1_goaway_on_a_stream() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(f.frame(f.GOAWAY, 0, 1, b"\0" * 8))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_9_1_1_initial_window_of_1() -> None:
    """No DATA frame larger than the window: one octet."""
    peer = Peer()
    peer.send(settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 1)))
    peer.read()
    peer.send(request(peer))
    assert [len(frame.payload) for frame in data_frames(peer)] == [1]


def test_h2spec_6_9_1_2_connection_window_over_the_maximum() -> None:
    """GOAWAY FLOW_CONTROL_ERROR."""
    peer = Peer()
    peer.send(window_update(0, 2**31 - 1), window_update(0, 2**31 - 1))
    connection_error(peer, f.FLOW_CONTROL_ERROR)


def test_h2spec_6_9_1_3_stream_window_over_the_maximum() -> None:
    """RST_STREAM FLOW_CONTROL_ERROR."""
    peer = Peer()
    peer.send(request(peer, end_stream=False))
    peer.send(window_update(1, 2**31 - 1), window_update(1, 2**31 - 1))
    stream_error(peer, 1, f.FLOW_CONTROL_ERROR)


def test_h2spec_6_9_2_1_initial_window_change_applies_to_open_streams() -> None:
    """A window of 0 at HEADERS, then 1: DATA of 1 octet."""
    peer = Peer()
    peer.send(settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 0)))
    peer.read()
    peer.send(request(peer))
    assert not data_frames(peer)
    peer.send(settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 1)))
    assert [len(frame.payload) for frame in data_frames(peer)] == [1]


def test_h2spec_6_9_2_2_a_negative_window_is_tracked() -> None:
    """A window of 3, lowered by 2 after 3 octets went: -2, so WINDOW_UPDATE 2 sends none
    and 3 more sends one octet (the 405's body is longer than 5 octets)."""
    peer = Peer()
    peer.send(settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 3)))
    peer.send(request(peer))
    assert [len(frame.payload) for frame in data_frames(peer)] == [3]
    peer.send(settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 1)), window_update(1, 2))
    assert data_frames(peer) == []
    peer.send(window_update(1, 1))
    assert [len(frame.payload) for frame in data_frames(peer)] == [1]


def test_h2spec_6_9_2_3_initial_window_size_over_the_maximum() -> None:
    """Connection error FLOW_CONTROL_ERROR."""
    peer = Peer()
    peer.send(settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 2**31)))
    connection_error(peer, f.FLOW_CONTROL_ERROR)


def test_h2spec_6_9_1_window_update_of_0() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(window_update(0, 0))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_9_2_window_update_of_0_on_a_stream() -> None:
    """Stream error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(request(peer, end_stream=False), window_update(1, 0))
    stream_error(peer, 1, f.PROTOCOL_ERROR)


def test_h2spec_6_9_3_window_update_not_of_4_octets() -> None:
    """Connection error FRAME_SIZE_ERROR."""
    peer = Peer()
    peer.send(f.frame(f.WINDOW_UPDATE, 0, 0, b"\0\0\x01"))
    connection_error(peer, f.FRAME_SIZE_ERROR)


def test_h2spec_6_10_1_continuations_after_headers() -> None:
    peer = Peer()
    more = continuation(1, peer.block([("x-dummy1", "d")]), end_headers=False)
    peer.send(open_block(peer), more, continuation(1, peer.block(DUMMY)))
    assert answered(peer).fields[":status"] == "405"


def test_h2spec_6_10_2_continuation_followed_by_another_frame() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    more = continuation(1, peer.block(DUMMY), end_headers=False)
    peer.send(open_block(peer), more, peer.data(1, b"test"))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_10_3_continuation_on_stream_0() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(open_block(peer), continuation(0, peer.block(DUMMY)))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_10_4_continuation_after_end_headers() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(request(peer), continuation(1, peer.block(DUMMY)))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_10_5_continuation_after_a_continuation_with_end_headers() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    end = continuation(1, peer.block(DUMMY))
    peer.send(open_block(peer), end, continuation(1, peer.block([("x-dummy1", "d")])))
    connection_error(peer, f.PROTOCOL_ERROR)


def test_h2spec_6_10_6_continuation_after_data() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(request(peer, end_stream=False, fields=POST), peer.data(1, b"test", False))
    peer.send(continuation(1, peer.block(DUMMY)))
    connection_error(peer, f.PROTOCOL_ERROR)


# -- 7 Error Codes, 8 HTTP Message Exchanges -----------------------------------------------------


def test_h2spec_7_1_goaway_with_an_unknown_error_code() -> None:
    """No special behaviour: a PING answered, or the connection closed gracefully."""
    peer = Peer()
    peer.send(f.goaway_frame(0, 0xFF, ""), ping())
    assert isinstance(peer.events[-1], ev.ConnectionEnded)  # no stream open: a graceful close
    assert peer.core.end_code == f.NO_ERROR
    assert f.GOAWAY not in [frame.kind for frame in peer.read()]


def test_h2spec_7_2_rst_stream_with_an_unknown_error_code() -> None:
    peer = Peer()
    peer.send(request(peer, end_stream=False), f.rst_stream_frame(1, 0xFF), ping())
    ping_acked(peer)


@pytest.mark.parametrize(
    ("case", "fields"),
    [
        ("8_1_2_1_1_unknown_pseudo_header", [*GET, (":test", "h2spec")]),
        ("8_1_2_1_2_response_pseudo_header", [*GET, (":status", "200")]),
        ("8_1_2_1_4_pseudo_header_after_a_regular_field", [*GET[:3], ("x", "y"), GET[3]]),
        ("8_1_2_2_1_connection_specific_field", [*GET, ("connection", "keep-alive")]),
        ("8_1_2_2_2_te_other_than_trailers", [*GET, ("te", "trailers, deflate")]),
        ("8_1_2_3_1_empty_path", [*GET[:2], (":path", ""), GET[3]]),
        ("8_1_2_3_2_no_method", GET[1:]),
        ("8_1_2_3_3_no_scheme", [GET[0], *GET[2:]]),
        ("8_1_2_3_4_no_path", [*GET[:2], GET[3]]),
        ("8_1_2_3_5_duplicated_method", [GET[0], *GET]),
        ("8_1_2_3_6_duplicated_scheme", [*GET[:2], *GET[1:]]),
        ("8_1_2_3_7_duplicated_path", [*GET[:3], *GET[2:]]),
        ("8_1_2_1_uppercase_field_name", [*GET, ("X-TEST", "h2spec")]),
    ],
)
def test_h2spec_malformed_request_is_a_stream_error(
    case: str, fields: list[tuple[str, str]]
) -> None:
    """h2spec 8.1.2.x: stream error PROTOCOL_ERROR (§8.1.1)."""
    peer = Peer()
    peer.send(request(peer, fields=fields))
    stream_error(peer, 1, f.PROTOCOL_ERROR)
    assert peer.counters.malformed_requests == 1


def test_h2spec_8_1_2_1_3_pseudo_header_in_trailers() -> None:
    """Stream error PROTOCOL_ERROR."""
    peer = Peer()
    trailers = f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, peer.block([(":path", "/")]))
    peer.send(request(peer, end_stream=False, fields=POST), peer.data(1, b"test", False), trailers)
    stream_error(peer, 1, f.PROTOCOL_ERROR)


def test_h2spec_8_1_2_6_1_content_length_unlike_the_data() -> None:
    """Stream error PROTOCOL_ERROR."""
    peer = Peer()
    fields = [*POST, ("content-length", "1")]
    peer.send(request(peer, end_stream=False, fields=fields), peer.data(1, b"test"))
    stream_error(peer, 1, f.PROTOCOL_ERROR)


def test_h2spec_8_1_2_6_2_content_length_unlike_the_sum_of_the_data() -> None:
    """Stream error PROTOCOL_ERROR."""
    peer = Peer()
    fields = [*POST, ("content-length", "1")]
    first = peer.data(1, b"test", False)
    peer.send(request(peer, end_stream=False, fields=fields), first, peer.data(1, b"test"))
    stream_error(peer, 1, f.PROTOCOL_ERROR)


def test_h2spec_8_1_1_second_headers_without_end_stream() -> None:
    """Stream error PROTOCOL_ERROR."""
    peer = Peer()
    second = f.frame(f.HEADERS, f.END_HEADERS, 1, peer.block(DUMMY))
    peer.send(request(peer, end_stream=False, fields=POST), peer.data(1, b"test", False), second)
    stream_error(peer, 1, f.PROTOCOL_ERROR)


def test_h2spec_8_2_1_push_promise() -> None:
    """Connection error PROTOCOL_ERROR."""
    peer = Peer()
    peer.send(f.frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\0\0\0\x02" + peer.block(GET)))
    connection_error(peer, f.PROTOCOL_ERROR)

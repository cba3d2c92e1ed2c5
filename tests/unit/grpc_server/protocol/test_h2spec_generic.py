"""h2spec's generic server cases: well-formed frames a server must take without complaint, each
sent as h2spec sends it (a GET /, which a gRPC server answers 405)."""

from __future__ import annotations

import pytest

from ratelimit_sidecar.grpc_server.protocol import frames as f
from tests.unit.grpc_server.protocol.peer import Peer
from tests.unit.grpc_server.protocol.test_h2spec import (
    DUMMY,
    GET,
    POST,
    answered,
    continuation,
    data_frames,
    open_block,
    ping,
    ping_acked,
    priority,
    request,
    settings,
    window_update,
)


def test_h2spec_generic_1_1_preface() -> None:
    peer = Peer()
    peer.send(ping())
    ping_acked(peer)


def test_h2spec_generic_2_1_priority_on_an_idle_stream() -> None:
    peer = Peer()
    peer.send(priority(1, 0), ping())
    ping_acked(peer)


@pytest.mark.parametrize("frame", [window_update(1, 1), priority(1, 0)], ids=["2_2", "2_3"])
def test_h2spec_generic_2_2_and_2_3_frames_on_half_closed_remote(frame: bytes) -> None:
    """WINDOW_UPDATE or PRIORITY while the 405 waits for window: the response goes on."""
    peer = Peer()
    peer.send(settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 0)), request(peer))
    peer.read()
    peer.send(frame, window_update(1, 1))
    assert data_frames(peer) and not peer.core.closing


def test_h2spec_generic_2_4_rst_stream_on_half_closed_remote() -> None:
    peer = Peer()
    peer.send(settings((f.SETTINGS_INITIAL_WINDOW_SIZE, 0)), request(peer))
    peer.send(f.rst_stream_frame(1, f.CANCEL), ping())
    ping_acked(peer)


def test_h2spec_generic_2_5_priority_on_a_closed_stream() -> None:
    peer = Peer()
    peer.send(request(peer))
    peer.read()
    peer.send(priority(1, 0), ping())
    ping_acked(peer)


@pytest.mark.parametrize(
    "frames",
    [
        [("data", b"test", True)],
        [("data", b"test", False), ("data", b"test", True)],
        [("padded", b"test", True)],
    ],
    ids=["3_1_1_data", "3_1_2_data_frames", "3_1_3_padded_data"],
)
def test_h2spec_generic_3_1_data(frames: list[tuple[str, bytes, bool]]) -> None:
    peer = Peer()
    sent = [request(peer, end_stream=False, fields=POST)]
    for kind, payload, end in frames:
        flags = (f.END_STREAM if end else 0) | (f.PADDED if kind == "padded" else 0)
        body = b"\x05" + payload + b"\0" * 5 if kind == "padded" else payload
        sent.append(f.frame(f.DATA, flags, 1, body))
    peer.send(*sent)
    assert answered(peer).fields[":status"] == "415"


def test_h2spec_generic_3_2_1_headers() -> None:
    peer = Peer()
    peer.send(request(peer))
    assert answered(peer).fields[":status"] == "405"


def test_h2spec_generic_3_2_2_padded_headers() -> None:
    peer = Peer()
    payload = b"\x08" + peer.block(GET) + b"\0" * 8
    peer.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM | f.PADDED, 1, payload))
    assert answered(peer).fields[":status"] == "405"


def test_h2spec_generic_3_2_3_headers_with_priority() -> None:
    peer = Peer()
    payload = (0).to_bytes(4, "big") + b"\xff" + peer.block(GET)
    peer.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM | f.PRIORITY_FLAG, 1, payload))
    assert answered(peer).fields[":status"] == "405"


@pytest.mark.parametrize(
    ("frame", "stream_id"),
    [
        (priority(1, 0, weight=0), 1),
        (priority(1, 0, weight=255), 1),
        (priority(3, 1), 3),
        (priority(3, 1, exclusive=True), 3),
        (priority(3, 0), 1),
    ],
    ids=["3_3_1_weight_1", "3_3_2_weight_256", "3_3_3_dependency", "3_3_4_exclusive", "3_3_5"],
)
def test_h2spec_generic_3_3_priority(frame: bytes, stream_id: int) -> None:
    """3.3.5: PRIORITY on idle stream 3 opens nothing: HEADERS on stream 1 is still fine."""
    peer = Peer()
    peer.send(frame, request(peer, stream_id))
    assert answered(peer, stream_id).fields[":status"] == "405"


def test_h2spec_generic_3_4_rst_stream() -> None:
    peer = Peer()
    peer.send(request(peer, end_stream=False), f.rst_stream_frame(1, f.CANCEL), ping())
    ping_acked(peer)


def test_h2spec_generic_3_5_settings() -> None:
    peer = Peer()
    peer.send(settings((f.SETTINGS_ENABLE_PUSH, 0)))
    assert [(x.kind, x.flags) for x in peer.read()] == [(f.SETTINGS, f.ACK)]


def test_h2spec_generic_3_7_ping() -> None:
    peer = Peer()
    peer.send(ping())
    ping_acked(peer)


def test_h2spec_generic_3_8_goaway() -> None:
    """The client leaves: with no stream open, the connection closes without an error."""
    peer = Peer()
    peer.send(f.goaway_frame(0, f.NO_ERROR, ""))
    assert peer.core.closing and peer.core.end_code == f.NO_ERROR
    assert peer.read() == []


@pytest.mark.parametrize("stream_id", [0, 1], ids=["3_9_1_connection", "3_9_2_stream"])
def test_h2spec_generic_3_9_window_update(stream_id: int) -> None:
    peer = Peer()
    peer.send(request(peer, end_stream=False), window_update(stream_id, 1), ping())
    ping_acked(peer)


def test_h2spec_generic_3_10_1_continuation() -> None:
    peer = Peer()
    peer.send(open_block(peer), continuation(1, peer.block(DUMMY)))
    assert answered(peer).fields[":status"] == "405"


def test_h2spec_generic_3_10_2_continuations() -> None:
    peer = Peer()
    more = continuation(1, peer.block([("x-dummy1", "d")]), end_headers=False)
    peer.send(open_block(peer), more, continuation(1, peer.block(DUMMY)))
    assert answered(peer).fields[":status"] == "405"


@pytest.mark.parametrize(
    ("method", "status"),
    [("GET", "405"), ("HEAD", "405"), ("POST", "415")],
    ids=["4_1_get", "4_2_head", "4_3_post"],
)
def test_h2spec_generic_4_requests(method: str, status: str) -> None:
    peer = Peer()
    peer.send(request(peer, fields=[(":method", method), *GET[1:]]))
    assert answered(peer).fields[":status"] == status


def test_h2spec_generic_4_4_post_with_trailers() -> None:
    peer = Peer()
    trailers = f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, peer.block([("trailer", "x")]))
    peer.send(request(peer, end_stream=False, fields=POST), peer.data(1, b"test", False), trailers)
    assert answered(peer).fields[":status"] == "415"


NAME_HUFFMAN = b"\x87\xb5\x05\xb1\x61\xcc\x5a\x93\x84\x9c\x48\xac\xa4"  # user-agent: h2spec
HPACK_REPRESENTATIONS = {
    "5_1_indexed": b"\xba",
    "5_2_incremental_indexed_name": b"\x40" + NAME_HUFFMAN,
    "5_3_incremental_indexed_name_huffman": b"\x40\x0auser-agent\x06h2spec",
    "5_4_incremental_new_name": b"\x40\x06x-test\x06h2spec",
    "5_5_incremental_new_name_huffman": b"\x40\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
    "5_6_without_indexing_indexed_name": b"\x00\x0auser-agent\x06h2spec",
    "5_7_without_indexing_indexed_name_huffman": b"\x00" + NAME_HUFFMAN,
    "5_8_without_indexing_new_name": b"\x00\x06x-test\x06h2spec",
    "5_9_without_indexing_new_name_huffman": b"\x00\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
    "5_10_never_indexed_indexed_name": b"\x10\x0auser-agent\x06h2spec",
    "5_11_never_indexed_indexed_name_huffman": b"\x10" + NAME_HUFFMAN,
    "5_12_never_indexed_new_name": b"\x10\x06x-test\x06h2spec",
    "5_13_never_indexed_new_name_huffman": b"\x10\x85\xf2\xb2\x4a\x84\xff\x84\x9c\x48\xac\xa4",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HPACK_REPRESENTATIONS))
def test_h2spec_generic_5_hpack_representations(case: str) -> None:
    peer = Peer()
    block = peer.block(GET) + HPACK_REPRESENTATIONS[case]
    peer.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, block))
    assert answered(peer).fields[":status"] == "405"


@pytest.mark.parametrize(
    "update", [b"\x3f\xe1\x1f", b"\x20\x3f\xe1\x1f"], ids=["5_14_one", "5_15_several"]
)
def test_h2spec_generic_5_dynamic_table_size_updates(update: bytes) -> None:
    peer = Peer()
    peer.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, update + peer.block(GET)))
    assert answered(peer).fields[":status"] == "405"

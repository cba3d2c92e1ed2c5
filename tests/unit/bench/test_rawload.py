"""bench/rawload.py's requests on the wire: stream ids, the rotation of bodies, header blocks
indexed after the first request, and DATA within the server's window."""

from __future__ import annotations

import hpack

from bench import rawload
from bench.workload import key_values, workload
from harness import h2frames as f
from ratelimit_sidecar._proto import wire


def frames_of(chunk: bytes) -> list[tuple[int, int, int, bytes]]:
    found, at = [], 0
    while at < len(chunk):
        high, low, kind, flags, sid = f.FRAME_HEADER.unpack_from(chunk, at)
        end = at + 9 + (high << 16 | low)
        found.append((kind, flags, sid, chunk[at + 9 : end]))
        at = end
    return found


def test_requests_cycle_the_bodies_with_a_stride_on_odd_stream_ids() -> None:
    bodies = list(workload("w", key_values(7)).frames)
    first, later = rawload.header_blocks(wire.METHOD_PATH, "127.0.0.1:1")
    requests = rawload.Requests(bodies, (first, later), first=5, stride=3)  # conn 2 of 3, offset 3
    chunk, used = requests.take(room=4, window=10_000)
    sent = frames_of(chunk)
    heads, datas = sent[0::2], sent[1::2]
    assert [p for *_, p in heads] == [first, later, later, later]
    assert {(k, fl) for k, fl, _, _ in heads} == {(f.HEADERS, f.END_HEADERS)}
    assert [sid for _, _, sid, _ in heads] == [sid for _, _, sid, _ in datas] == [1, 3, 5, 7]
    assert [(k, fl) for k, fl, _, _ in datas] == [(f.DATA, f.END_STREAM)] * 4
    assert [p for *_, p in datas] == [bodies[5], bodies[1], bodies[4], bodies[0]]
    assert used == sum(len(p) for *_, p in datas)
    assert requests.sent == 4
    assert frames_of(requests.take(room=1, window=10_000)[0])[0][2] == 9


def test_header_blocks_after_the_first_are_indexes_into_the_servers_table() -> None:
    decoder = hpack.Decoder()
    first, later = rawload.header_blocks(wire.METHOD_PATH, "127.0.0.1:1")
    fields = {
        b":method": b"POST", b":scheme": b"http", b":path": wire.METHOD_PATH.encode(),
        b":authority": b"127.0.0.1:1", b"content-type": b"application/grpc", b"te": b"trailers",
    }  # fmt: skip
    assert dict(decoder.decode(first, raw=True)) == fields
    assert decoder.header_table.dynamic_entries  # the first block taught the server's table
    for _ in range(3):  # each later block decodes alike from that table, a byte per field
        assert dict(decoder.decode(later, raw=True)) == fields
    assert len(later) == len(fields)


def test_a_batch_stops_at_the_connection_window_and_the_free_streams() -> None:
    bodies = list(workload("w", key_values(3)).frames)
    size = len(bodies[0])
    assert len({*map(len, bodies)}) == 1
    requests = rawload.Requests(bodies, (b"", b""), first=0, stride=1)
    assert requests.take(room=10, window=3 * size + size - 1)[1] == 3 * size
    assert requests.take(room=2, window=100 * size)[1] == 2 * size
    assert requests.take(room=10, window=size - 1) == (b"", 0)
    assert requests.sent == 5

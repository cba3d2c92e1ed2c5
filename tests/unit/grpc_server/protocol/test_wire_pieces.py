"""The protocol core's wire pieces: response header blocks, timeouts, the header block cache."""

from __future__ import annotations

import hpack
import pytest

from ratelimit_sidecar.grpc_server.protocol import responses as r
from ratelimit_sidecar.grpc_server.protocol import validation as v
from ratelimit_sidecar.grpc_server.protocol.headers import HeaderBlocks
from ratelimit_sidecar.grpc_server.protocol.limits import Counters


def decode(block: bytes) -> dict[str, str]:
    return {str(name): str(value) for name, value in hpack.Decoder().decode(block)}


def test_response_blocks_decode_as_grpc_headers_and_trailers() -> None:
    assert decode(r.GRPC_RESPONSE_HEADERS) == {":status": "200", "content-type": "application/grpc"}
    assert decode(r.GRPC_OK_TRAILERS) == {"grpc-status": "0"}


def test_a_status_message_is_percent_encoded_and_trailers_only_carries_headers() -> None:
    block = r.grpc_status_block(3, "bad: 100% ünïcode\n", trailers_only=True)
    fields = decode(block)
    assert fields[":status"] == "200" and fields["grpc-status"] == "3"
    assert fields["grpc-message"] == "bad: 100%25 %C3%BCn%C3%AFcode%0A"


def test_long_names_and_values_use_multi_byte_lengths() -> None:
    value = b"v" * 1000
    assert dict(hpack.Decoder().decode(r.literal(b"x-long", value), raw=True)) == {b"x-long": value}


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(b"100m", 0.1), (b"2S", 2.0), (b"1H", 3600.0), (b"5u", 5e-6), (b"7", -1.0), (b"x1m", -1.0)],
)
def test_grpc_timeout_units(value: bytes, seconds: float) -> None:
    assert v.grpc_timeout_s(value) == pytest.approx(seconds)


def test_a_repeated_block_is_read_once_until_the_table_changes() -> None:
    encoder = hpack.Encoder()
    blocks = HeaderBlocks(lambda _path: v.UNARY, 16_384, 65_536, Counters())
    request = [(":method", "POST"), (":scheme", "http"), (":path", "/a"), ("x-key", "one")]
    request += [("content-type", "application/grpc"), ("te", "trailers")]
    blocks.request(encoder.encode(request))  # adds them to the dynamic table
    repeat = encoder.encode(request)  # indices only
    once = blocks.request(repeat)
    assert blocks.request(repeat) is once
    blocks.request(encoder.encode([*request[:3], ("x-other", "two"), *request[4:]]))
    again = blocks.request(repeat)  # a new entry: the same indices name other fields
    assert again is not once
    assert dict(again.headers)[b"x-key"] == b"one"

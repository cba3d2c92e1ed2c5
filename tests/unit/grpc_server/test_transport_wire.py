"""The fast transport's wire pieces, without a socket: header blocks, timeouts, the header
block cache."""

from __future__ import annotations

import hpack
import pytest

from ratelimit_sidecar.grpc_server.transport import frames as f
from ratelimit_sidecar.grpc_server.transport.headers import BlockDecoder
from ratelimit_sidecar.grpc_server.transport.server import _timeout_s


def decode(block: bytes) -> dict[str, str]:
    return {str(name): str(value) for name, value in hpack.Decoder().decode(block)}


def test_response_blocks_decode_as_grpc_headers_and_trailers() -> None:
    assert decode(f.GRPC_RESPONSE_HEADERS) == {":status": "200", "content-type": "application/grpc"}
    assert decode(f.GRPC_OK_TRAILERS) == {"grpc-status": "0"}


def test_a_status_message_is_percent_encoded_and_trailers_only_carries_headers() -> None:
    block = f.grpc_status_block(3, "bad: 100% ünïcode\n", headers_too=True)
    fields = decode(block)
    assert fields[":status"] == "200" and fields["grpc-status"] == "3"
    assert fields["grpc-message"] == "bad: 100%25 %C3%BCn%C3%AFcode%0A"


def test_long_names_and_values_use_multi_byte_lengths() -> None:
    value = b"v" * 1000
    assert dict(hpack.Decoder().decode(f.literal(b"x-long", value), raw=True)) == {b"x-long": value}


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(b"100m", 0.1), (b"2S", 2.0), (b"1H", 3600.0), (b"5u", 5e-6), (b"7", -1.0), (b"x1m", -1.0)],
)
def test_grpc_timeout_units(value: bytes, seconds: float) -> None:
    assert _timeout_s(value) == pytest.approx(seconds)


def test_a_repeated_block_is_decoded_once_until_the_table_changes() -> None:
    encoder, decoder = hpack.Encoder(), BlockDecoder(65536)
    first = encoder.encode([(":path", "/a"), ("x-key", "one")])
    decoder.decode(first)  # adds both to the dynamic table
    repeat = encoder.encode([(":path", "/a"), ("x-key", "one")])  # indices only
    once = decoder.decode(repeat)
    assert decoder.decode(repeat) is once
    decoder.decode(encoder.encode([("x-other", "two")]))  # a new entry: indices shift
    again = decoder.decode(repeat)
    assert again is not once
    assert dict(again.headers)[b"x-key"] == b"one"

"""Bugs the differential test and the fuzzer found in the protocol core, fixed: one test each
keeps them fixed.

RST_STREAM on an idle stream. RFC 9113 §6.4: "RST_STREAM frames MUST NOT be sent for a stream
in the 'idle' state"; a client receiving one treats it as a connection error. A PRIORITY frame
does not open a stream (§5.1: idle stays idle), yet the core answered a PRIORITY on an idle
stream that depends on itself (§5.3.1) or is not 5 octets long (§6.3) with the stream error
those sections name: RST_STREAM on the idle stream. It now answers with a connection error of
the same code, which h2spec's 5.3.1 and 6.3 cases accept and h2 answers too.
"""

from __future__ import annotations

import base64

import pytest

from ratelimit_sidecar.grpc_server.protocol import frames as f
from tests.fuzz import target
from tests.unit.grpc_server.protocol.peer import Peer

# The fuzzer's first crash (atheris, structured mode): a PRIORITY frame on stream 0x1c9c9c9c
# (even, idle) that depends on itself, answered with RST_STREAM on that stream.
FUZZ_CRASH = base64.b64decode(
    "AQAAACIAAAUCnJycnJycnJycnJycnJycnJycnAAAAACBAAAAAAAAAAsBBQAAACiChoRBhqDkHROdCQs="
)


def priority(stream_id: int, depends_on: int, length: int = 5) -> bytes:
    payload = depends_on.to_bytes(4, "big") + b"\x10"
    return f.frame(f.PRIORITY, 0, stream_id, payload[:length])


def resets_on(peer: Peer, stream_id: int) -> list[int]:
    return [
        frame.error_code
        for frame in peer.read()
        if frame.kind == f.RST_STREAM and frame.stream_id == stream_id
    ]


@pytest.mark.parametrize(
    ("stream_id", "depends_on", "length"),
    [(1, 1, 5), (2, 2, 5), (1, 0, 4), (2, 0, 4)],
    ids=["self-dependent odd", "self-dependent even", "short odd", "short even"],
)
def test_no_rst_stream_on_an_idle_stream_for_a_bad_priority(
    stream_id: int, depends_on: int, length: int
) -> None:
    """Exact input: the preface, an empty SETTINGS, the ACK of ours, then
    PRIORITY(stream_id, depends_on, weight 16) cut to `length` octets."""
    peer = Peer()
    peer.send(priority(stream_id, depends_on, length))
    assert resets_on(peer, stream_id) == []


def test_no_rst_stream_on_an_idle_stream_above_the_newest() -> None:
    """A request on stream 1, then a self-dependent PRIORITY on stream 101, still idle."""
    peer = Peer()
    peer.send(peer.call(1))
    peer.read()
    peer.send(priority(101, 101))
    assert resets_on(peer, 101) == []


def test_the_fuzzers_input_breaks_no_invariant() -> None:
    assert target.run(FUZZ_CRASH, strict=True) == []


def test_the_fuzzers_input_meets_no_known_finding() -> None:
    assert target.run(FUZZ_CRASH) == []

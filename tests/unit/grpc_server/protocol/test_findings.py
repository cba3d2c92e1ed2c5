"""Bugs the differential test and the fuzzer found in the protocol core, one failing test each
(xfail, strict: a fix turns them into XPASS, which fails until the mark goes; then remove the
matching KNOWN_BUGS entry of test_differential.py and KNOWN_FINDINGS entry of
tests/fuzz/target.py).

RST_STREAM on an idle stream. RFC 9113 §6.4: "RST_STREAM frames MUST NOT be sent for a stream
in the 'idle' state. If a RST_STREAM frame identifying an idle stream is received, the recipient
MUST treat this as a connection error (Section 5.4.1) of type PROTOCOL_ERROR." A PRIORITY frame
does not open a stream (§5.1: idle stays idle), yet the core answers a PRIORITY on an idle
stream that depends on itself (§5.3.1) or is not 5 octets long (§6.3) with the stream error
those sections name: RST_STREAM on the idle stream, even on an even one, which a client never
opens. A conforming client (h2, nghttp2) then closes the whole connection.

Fix (connection.py, `_on_control`, the PRIORITY branch): when the stream is idle
(`self._state(stream_id) == s.IDLE`), raise `f.ConnectionFault` with the same code instead of
`f.StreamFault`: the error cannot be a stream error on a stream that does not exist, and a
connection error is what h2 answers and what h2spec's 5.3.1 and 6.3 cases accept. (Dropping
the frame would do for §6.4 too, but §5.3.1 and §6.3 say the frame is an error.)
"""

from __future__ import annotations

import base64

import pytest

from ratelimit_sidecar.grpc_server.protocol import frames as f
from tests.fuzz import target
from tests.unit.grpc_server.protocol.peer import Peer

IDLE_RESET = pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="the core sends RST_STREAM on an idle stream (RFC 9113 §6.4)",
)
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


@IDLE_RESET
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


@IDLE_RESET
def test_no_rst_stream_on_an_idle_stream_above_the_newest() -> None:
    """A request on stream 1, then a self-dependent PRIORITY on stream 101, still idle."""
    peer = Peer()
    peer.send(peer.call(1))
    peer.read()
    peer.send(priority(101, 101))
    assert resets_on(peer, 101) == []


@IDLE_RESET
def test_the_fuzzers_input_breaks_no_invariant() -> None:
    assert target.run(FUZZ_CRASH, strict=True) == []


def test_the_fuzzers_input_meets_only_the_known_finding() -> None:
    """Tolerated (the long run goes on past it), the input breaks no other invariant."""
    assert target.run(FUZZ_CRASH) == [target.IDLE_RESET]

"""Hostile HTTP/2 against the fast transport of a real sidecar process: each abuse gets the
answer RFC 9113 gives for it (GOAWAY or RST_STREAM with its code), and a grpcio client on
another connection is served all along."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from harness.h2raw import RawH2, grpc_message
from harness.rules import write_rules
from harness.sidecar import SidecarProcess
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol.frames import ErrorCode
from ratelimit_sidecar.grpc_server.transport.options import PORT_DEFAULTS

BODY = request("gateway", [("api_key", "abuse")]).SerializeToString()
OK_STATUS = 0
FLOOD_BUDGET = PORT_DEFAULTS.limits.control_frames_burst
MAX_CONCURRENT_STREAMS = PORT_DEFAULTS.limits.max_concurrent_streams


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    rules = write_rules(tmp_path_factory.mktemp("abuse"))
    process = SidecarProcess(rules, transport="fast").wait_ready()
    yield process
    assert process.stop() == 0, process.stderr


@pytest.fixture
def raw(sidecar: SidecarProcess) -> Iterator[RawH2]:
    client = RawH2(sidecar.port)
    yield client
    client.close()


@pytest.fixture(autouse=True)
def others_are_served(sidecar: SidecarProcess) -> Iterator[None]:
    """After each abuse, a grpcio client on its own connection still gets its answer."""
    yield
    assert_served(sidecar)


def assert_served(sidecar: SidecarProcess) -> None:
    with grpc.insecure_channel(sidecar.address) as channel:
        reply = rls_stub(channel).ShouldRateLimit(request("gateway", [("tier", "x")]), timeout=5)
    assert reply.overall_code == wire.Code.OK


def assert_goaway(raw: RawH2, code: ErrorCode) -> None:
    frame = raw.goaway()
    assert frame is not None, "the connection ended without GOAWAY"
    assert frame.error_code == code, frame.payload
    raw.frames_until(-1, timeout_s=5)  # then the server closes the connection


def test_a_request_is_answered_with_its_status_in_trailers(raw: RawH2) -> None:
    raw.send(raw.call(1, BODY))
    response = raw.response(1)
    assert response.headers[":status"] == "200"
    assert response.headers["content-type"] == "application/grpc"
    assert response.status == OK_STATUS and response.body[:1] == b"\0"
    assert wire.RateLimitResponse.FromString(response.body[5:]).overall_code == wire.Code.OK


def test_a_bad_preface_is_goaway_protocol_error(sidecar: SidecarProcess) -> None:
    client = RawH2(sidecar.port, preface=False)
    client.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_goaway(client, ErrorCode.PROTOCOL_ERROR)
    client.close()


def test_unknown_frame_types_are_ignored(raw: RawH2) -> None:
    raw.send(f.frame(0x42, 0, 0, b"whatever"), f.frame(0xFA, 0xFF, 1, b"x" * 100))
    raw.send(raw.call(1, BODY))
    assert raw.response(1).status == OK_STATUS


@pytest.mark.parametrize(
    "flood",
    [f.frame(f.PING, 0, 0, b"12345678"), f.settings_frame([(f.SETTINGS_ENABLE_PUSH, 0)])],
    ids=["ping", "settings"],
)
def test_a_control_frame_flood_is_goaway_enhance_your_calm(raw: RawH2, flood: bytes) -> None:
    sender = threading.Thread(target=raw.send, args=(flood * (FLOOD_BUDGET + 10),), daemon=True)
    sender.start()  # the server answers each frame: read while sending
    assert_goaway(raw, ErrorCode.ENHANCE_YOUR_CALM)
    sender.join(10)


def test_rapid_reset_is_goaway_enhance_your_calm(raw: RawH2) -> None:
    streams = range(1, 2 * (FLOOD_BUDGET + 10), 2)
    burst = b"".join(
        raw.headers(sid) + f.rst_stream_frame(sid, ErrorCode.CANCEL) for sid in streams
    )
    sender = threading.Thread(target=raw.send, args=(burst,), daemon=True)
    sender.start()
    assert_goaway(raw, ErrorCode.ENHANCE_YOUR_CALM)
    sender.join(10)


def test_a_continuation_flood_is_goaway_enhance_your_calm(raw: RawH2) -> None:
    raw.send(f.frame(f.HEADERS, 0, 1, raw.encoder.encode([(":method", "POST")])))
    chunk = f.frame(f.CONTINUATION, 0, 1, b"\x00" * 16_000)
    sender = threading.Thread(target=raw.send, args=(chunk * 100,), daemon=True)
    sender.start()
    assert_goaway(raw, ErrorCode.ENHANCE_YOUR_CALM)
    sender.join(10)


def test_headers_over_the_limit_get_resource_exhausted(raw: RawH2) -> None:
    raw.send(raw.headers(1, extra=(("x-big", "v" * 20_000),)) + raw.data(1, grpc_message(BODY)))
    response = raw.response(1)
    assert response.status == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert "headers over the limit" in response.message
    raw.send(raw.call(3, BODY))  # the connection goes on
    assert raw.response(3).status == OK_STATUS


def test_a_zero_window_holds_the_answer_until_the_client_opens_it(raw: RawH2) -> None:
    raw.send(f.settings_frame([(f.SETTINGS_INITIAL_WINDOW_SIZE, 0)]), raw.call(1, BODY))
    frames = raw.frames_until(f.HEADERS, 1)
    assert frames[-1].flags & f.END_STREAM == 0  # the response headers, no data yet
    with pytest.raises(TimeoutError):
        raw.frames_until(f.DATA, 1, timeout_s=0.5)
    raw.send(f.window_update_frame(1, 1_000))
    response = raw.response(1)
    assert response.status == OK_STATUS and len(response.body) > 5


def test_streams_over_the_limit_are_refused_and_the_rest_answered(raw: RawH2) -> None:
    streams = [1 + 2 * i for i in range(MAX_CONCURRENT_STREAMS + 500)]
    raw.send(b"".join(raw.headers(sid) for sid in streams))
    refused = set()
    for frame in raw.frames_until(f.RST_STREAM, streams[-1]):
        if frame.kind == f.RST_STREAM:
            assert frame.error_code == ErrorCode.REFUSED_STREAM
            refused.add(frame.stream_id)
    assert refused == set(streams[MAX_CONCURRENT_STREAMS:])
    raw.send(
        b"".join(raw.data(sid, grpc_message(BODY)) for sid in streams[:MAX_CONCURRENT_STREAMS])
    )
    answers = raw.responses(streams[:MAX_CONCURRENT_STREAMS])
    assert {answer.status for answer in answers.values()} == {OK_STATUS}


def test_a_half_closed_connection_gets_its_answers_then_closes(raw: RawH2) -> None:
    raw.send(raw.call(1, BODY), raw.call(3, BODY))
    raw.sock.shutdown(2 - 1)  # SHUT_WR: the client sends nothing more
    answers = raw.responses([1, 3])
    assert answers[1].status == answers[3].status == OK_STATUS
    assert raw.frames_until(-1, timeout_s=5) is not None  # read up to the server's close


def test_a_slow_reader_stalls_only_its_own_connection(raw: RawH2, sidecar: SidecarProcess) -> None:
    calls = 20_000
    burst = b"".join(raw.call(1 + 2 * i, BODY) for i in range(calls))
    sender = threading.Thread(target=raw.send, args=(burst,), daemon=True)
    sender.start()  # nothing is read until the others were served
    for _ in range(20):
        assert_served(sidecar)
    answered = 0
    while answered < calls:
        frame = raw.read_frame(10)
        assert frame is not None
        answered += frame.kind == f.HEADERS and bool(frame.flags & f.END_STREAM)
    sender.join(10)
    assert not sender.is_alive()


def test_a_missing_body_runs_into_its_deadline(raw: RawH2) -> None:
    raw.send(raw.headers(1, extra=(("grpc-timeout", "200m"),)))
    response = raw.response(1, timeout_s=5)
    assert response.status == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]


def test_a_message_over_the_limit_gets_resource_exhausted(raw: RawH2) -> None:
    raw.send(
        raw.headers(1),
        raw.data(1, b"\0" + (5 * 1024 * 1024).to_bytes(4) + b"x" * 100, end_stream=False),
    )
    response = raw.response(1)
    assert response.status == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert "over the limit" in response.message


def test_a_compressed_call_gets_a_clear_status(raw: RawH2) -> None:
    raw.send(
        raw.headers(1, extra=(("grpc-encoding", "gzip"),)),
        raw.data(1, b"\1" + grpc_message(BODY)[1:]),
    )
    response = raw.response(1)
    assert response.status == grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert "send messages uncompressed" in response.message
    assert response.headers["grpc-accept-encoding"] == "identity"


def test_an_unknown_method_is_unimplemented(raw: RawH2) -> None:
    raw.send(raw.call(1, BODY, path="/nope.Service/Nothing"))
    response = raw.response(1)
    assert response.status == grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert "/nope.Service/Nothing" in response.message


def test_sigterm_sends_goaway_and_answers_the_calls_in_flight(tmp_path: Path) -> None:
    process = SidecarProcess(write_rules(tmp_path), transport="fast").wait_ready()
    client = RawH2(process.port)
    client.send(client.headers(1))  # in flight: its body comes after the GOAWAY
    client.frames_until(f.SETTINGS, 0)
    process.proc.send_signal(signal.SIGTERM)
    goaway = client.goaway()
    assert goaway is not None and goaway.error_code == ErrorCode.NO_ERROR
    client.send(client.data(1, grpc_message(BODY)))
    assert client.response(1).status == OK_STATUS
    assert client.read_frame(10) is None  # then the server closes the connection
    client.close()
    assert process.stop() == 0, process.stderr

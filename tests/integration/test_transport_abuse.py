"""Hostile HTTP/2 against the fast transport of a real sidecar process: each abuse gets the
answer RFC 9113 gives for it (GOAWAY or RST_STREAM with its code), and a grpcio client on
another connection is served all along.

The attacks of the bounded-transport issue (harness/attacks.py, numbered as there) run against a
sidecar of their own where they bloat or stall it or need flags, and are judged by the process's
resident memory, other clients' latencies meanwhile, and what the attacker got back. They assert
what the bounded transport must do; the limits are the tests' own numbers or the server's
advertised SETTINGS, never the transport's constants. ABUSE_DROP_UNKNOWN_FLAGS=1 starts a sidecar
without the flags it does not know (a tree from before them: recording its behaviour) instead of
failing to start it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from harness import attacks
from harness import h2frames as f
from harness.attacks import (
    CONNECTIONS_16,
    CONTROL_FRAMES,
    MIB,
    NARROW_BOUNDS,
    PEER_8,
    RECEIVE_1S,
    TLS_1S,
    WIDE_BOUNDS,
    Launched,
    Observed,
    Setup,
    Target,
)
from harness.grpc_client import request, rls_stub
from harness.h2raw import RawH2, grpc_message
from harness.rules import write_rules
from harness.sidecar import SidecarProcess
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.grpc_server.protocol.frames import ErrorCode

BODY = request("gateway", [("api_key", "abuse")]).SerializeToString()
OK_STATUS = 0
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
FLOOD_FRAMES = 10_000  # control frames without requests: far over any budget a connection needs
DROP_UNKNOWN = os.environ.get("ABUSE_DROP_UNKNOWN_FLAGS") == "1"


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
    [f.frame(f.PING, 0, 0, b"12345678"), f.settings({f.SETTINGS_ENABLE_PUSH: 0})],
    ids=["ping", "settings"],
)
def test_a_control_frame_flood_is_goaway_enhance_your_calm(raw: RawH2, flood: bytes) -> None:
    sender = threading.Thread(target=raw.send, args=(flood * FLOOD_FRAMES,), daemon=True)
    sender.start()  # the server answers each frame: read while sending
    assert_goaway(raw, ErrorCode.ENHANCE_YOUR_CALM)
    sender.join(10)


def test_rapid_reset_is_goaway_enhance_your_calm(raw: RawH2) -> None:
    streams = range(1, 2 * FLOOD_FRAMES, 2)
    burst = b"".join(raw.headers(sid) + f.rst_stream(sid, ErrorCode.CANCEL) for sid in streams)
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
    raw.send(f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 0}), raw.call(1, BODY))
    frames = raw.frames_until(f.HEADERS, 1)
    assert frames[-1].flags & f.END_STREAM == 0  # the response headers, no data yet
    with pytest.raises(TimeoutError):
        raw.frames_until(f.DATA, 1, timeout_s=0.5)
    raw.send(f.window_update(1, 1_000))
    response = raw.response(1)
    assert response.status == OK_STATUS and len(response.body) > 5


def test_streams_over_the_limit_are_refused_and_the_rest_answered(raw: RawH2) -> None:
    limit = raw.advertised()[f.SETTINGS_MAX_CONCURRENT_STREAMS]
    streams = [1 + 2 * i for i in range(limit + 500)]
    raw.send(b"".join(raw.headers(sid) for sid in streams))
    refused = set()
    for frame in raw.frames_until(f.RST_STREAM, streams[-1]):
        if frame.kind == f.RST_STREAM:
            assert frame.error_code == ErrorCode.REFUSED_STREAM
            refused.add(frame.stream_id)
    assert refused == set(streams[limit:])
    raw.send(b"".join(raw.data(sid, grpc_message(BODY)) for sid in streams[:limit]))
    answers = raw.responses(streams[:limit])
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


# -- the attacks of the bounded-transport issue -------------------------------------------------


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[[Setup], Target]]:
    """Sidecars of the test's own, stopped after it (killed if stalled)."""
    started: list[Launched] = []

    def start(setup: Setup) -> Target:
        workdir = tmp_path / f"sidecar-{len(started)}"
        started.append(attacks.launch(setup, workdir, drop_unknown=DROP_UNKNOWN))
        return started[-1].target

    yield start
    for launched in started:
        launched.stop()


def target_of(sidecar: SidecarProcess) -> Target:
    return Target(sidecar.port, sidecar.proc.pid)


def require(observed: Observed, checks: dict[str, bool]) -> None:
    """Every check holds; else one failure naming each that does not, with all observed."""
    missed = [name for name, held in checks.items() if not held]
    assert not missed, f"missed: {'; '.join(missed)}\nobserved: {observed}"


def served(observed: Observed) -> bool:
    """Other clients' calls during the attack were all answered."""
    return bool(observed.others_ms) and not observed.others_failed


def p99_below(observed: Observed, ms: float) -> bool:
    p99 = observed.others(99)
    return p99 is not None and p99 < ms


def test_1_headers_on_a_half_closed_stream_are_stream_closed(
    launch: Callable[[Setup], Target],
) -> None:
    observed = attacks.watch_reopened(launch(Setup()))
    closed = observed.goaway == ErrorCode.STREAM_CLOSED or any(
        end.stream_id == 1 and end.reset == ErrorCode.STREAM_CLOSED for end in observed.ends
    )
    require(observed, {
        "RSS growth < 30 MB": observed.rss_growth_mb < 30,
        "STREAM_CLOSED: RST_STREAM on the Watch's stream, or GOAWAY (RFC 9113 §5.1)": closed,
        "other clients served": served(observed),
    })  # fmt: skip


def test_2_settings_that_touch_every_open_stream_do_not_stall_others(
    launch: Callable[[Setup], Target],
) -> None:
    observed = attacks.settings_flood(launch(Setup()))
    require(observed, {
        "other clients' p99 < 50 ms": p99_below(observed, 50),
        "other clients served": served(observed),
    })  # fmt: skip


@pytest.mark.parametrize("bounds", [(), WIDE_BOUNDS], ids=["default-bounds", "4MiB-in-bounds"])
def test_3_unfinished_messages_are_held_within_a_process_budget(
    launch: Callable[[Setup], Target], bounds: tuple[str, ...]
) -> None:
    observed = attacks.uploads(launch(Setup(bounds)))
    refused = [e for e in observed.ends if e.reset is not None or e.status == RESOURCE_EXHAUSTED]
    require(observed, {
        "RSS growth < 160 MB": observed.rss_growth_mb < 160,
        "streams refused (RESOURCE_EXHAUSTED, RST_STREAM) once the budget is spent": bool(refused),
        "every stream ended was refused so": len(refused) == len(observed.ends),
        "other clients served": served(observed),
    })  # fmt: skip


@pytest.mark.parametrize(
    ("bounds", "announced"),
    [(NARROW_BOUNDS, MIB), ((), 4 * MIB)],
    ids=["narrow-bounds-1MiB", "default-bounds-4MiB"],
)
def test_3_a_prefix_over_the_largest_request_is_refused_at_once(
    launch: Callable[[Setup], Target], bounds: tuple[str, ...], announced: int
) -> None:
    observed = attacks.huge_prefix(launch(Setup(bounds)), announced)
    end = observed.ends[0] if observed.ends else None
    require(observed, {
        "grpc-status RESOURCE_EXHAUSTED": end is not None and end.status == RESOURCE_EXHAUSTED,
        "at once (within 1 s, the rest of the message never sent)": end is not None
        and end.after_s < 1.0,
    })  # fmt: skip


def ended_by_the_receive_timeout(observed: Observed, timeout_s: float) -> dict[str, bool]:
    """Each stalled call ended by the server on its stream (not by GOAWAY), not with OK, after
    about `timeout_s` (not at once, within 2 s more)."""
    ends = observed.ends
    return {
        "every stalled call ended": observed.unended == 0,
        "each on its stream (trailers or RST_STREAM), no GOAWAY": observed.goaway is None,
        "none with OK": all(end.status != OK_STATUS for end in ends),
        f"after {timeout_s:g} s, not at once": all(end.after_s >= timeout_s / 2 for end in ends),
        f"within {timeout_s:g} s + 2 s": all(end.after_s < timeout_s + 2 for end in ends),
    }


def test_4_stalled_calls_end_after_the_receive_timeout(launch: Callable[[Setup], Target]) -> None:
    observed = attacks.stalled_streams(launch(Setup(RECEIVE_1S)), wait_s=4)
    require(observed, ended_by_the_receive_timeout(observed, 1))


def test_4_stalled_calls_end_after_the_default_receive_timeout_of_10_s(
    launch: Callable[[Setup], Target],
) -> None:
    target = launch(Setup())
    observed = attacks.stalled_streams(target, headers_only=2, half_messages=2, wait_s=13)
    require(observed, ended_by_the_receive_timeout(observed, 10))


def made_room(observed: attacks.Crowd, idle: int, room: int) -> dict[str, bool]:
    """A new connection served, the oldest idle connections closed, each after a GOAWAY, at
    least as many as `idle` + 1 less `room`."""
    return {
        f"all {idle:,} idle connections opened": observed.opened == idle,
        "a new connection served": observed.newcomer == "OK",
        "every connection the server closed got GOAWAY first": not observed.dropped,
        f"at least {idle + 1 - room:,} idle connections closed": len(observed.evicted)
        >= idle + 1 - room,
        "the least recently active first": 0 in observed.evicted
        and idle - 1 not in observed.evicted,
    }


def test_5_at_the_descriptor_limit_idle_connections_make_room(
    launch: Callable[[Setup], Target],
) -> None:
    observed = attacks.crowd(launch(Setup(nofile=1024)), idle=1_100)
    require(observed, made_room(observed, 1_100, 1_024))


@pytest.mark.parametrize(
    ("flags", "idle", "cap"),
    [(CONNECTIONS_16, 40, 16), (PEER_8, 20, 8)],
    ids=["max-connections", "max-connections-per-peer"],
)
def test_5_a_connection_cap_closes_the_least_recently_active_idle_connection(
    launch: Callable[[Setup], Target], flags: tuple[str, ...], idle: int, cap: int
) -> None:
    observed = attacks.crowd(launch(Setup(flags)), idle=idle)
    require(observed, made_room(observed, idle, cap))


def test_6_settings_pushing_a_window_past_2_31_is_goaway_flow_control_error(
    sidecar: SidecarProcess,
) -> None:
    observed = attacks.window_overflow(target_of(sidecar))
    require(
        observed, {"GOAWAY FLOW_CONTROL_ERROR": observed.goaway == ErrorCode.FLOW_CONTROL_ERROR}
    )


def test_7_a_preface_followed_by_ping_is_goaway_protocol_error(sidecar: SidecarProcess) -> None:
    observed = attacks.ping_first(target_of(sidecar))
    require(observed, {"GOAWAY PROTOCOL_ERROR": observed.goaway == ErrorCode.PROTOCOL_ERROR})


# A WINDOW_UPDATE with each call is what grpc's C-core client sends (it credits every answer it
# reads): no flood. A WINDOW_UPDATE flood without calls is one (the protocol core's unit tests).
FLOODS_BETWEEN_CALLS = [name for name in CONTROL_FRAMES if name != "window_update"]


@pytest.mark.parametrize("control", FLOODS_BETWEEN_CALLS)
def test_8_a_control_frame_flood_between_calls_is_goaway_enhance_your_calm(
    sidecar: SidecarProcess, control: str
) -> None:
    observed = attacks.interleaved_flood(target_of(sidecar), control)
    require(observed, {
        "GOAWAY ENHANCE_YOUR_CALM": observed.goaway == ErrorCode.ENHANCE_YOUR_CALM,
        "other clients served": served(observed),
    })  # fmt: skip


def test_8_keepalive_pings_are_not_a_flood(sidecar: SidecarProcess) -> None:
    observed = attacks.keepalive(target_of(sidecar), seconds=4)
    answered = [end for end in observed.ends if end.status == OK_STATUS]
    require(observed, {
        "no GOAWAY": observed.goaway is None,
        "every PING acknowledged": observed.pings_acked == 4,
        "every call answered": len(answered) == 4,
    })  # fmt: skip


def test_9_a_tls_handshake_never_finished_is_closed_after_its_timeout(
    launch: Callable[[Setup], Target],
) -> None:
    observed = attacks.tls_stall(launch(Setup(TLS_1S, tls=True)), connections=4, wait_s=4)
    closed = observed.closed_after_s
    require(observed, {
        "every silent connection closed": len(closed) == 4,
        "within 1 s + 2 s": all(after < 3 for after in closed),
    })  # fmt: skip

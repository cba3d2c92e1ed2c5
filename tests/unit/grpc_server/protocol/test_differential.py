"""Differential test: the protocol core against python-hyper's h2, frame by frame.

hypothesis writes a client's script (differential.py): a valid or invalid preface, then HTTP/2
frames, valid and not: request HEADERS (a gRPC request, or one of its mutations: uppercase
names, missing, duplicate or unknown pseudo-headers, connection-specific fields, te other than
trailers, an empty :path, a self-dependent priority, padding), CONTINUATION, DATA (on open,
idle and closed streams, END_STREAM again, padded), WINDOW_UPDATE (0, huge, on idle streams),
RST_STREAM, SETTINGS (valid and invalid values, ACK with a payload, bad lengths), PING,
PRIORITY, GOAWAY, unknown types and PUSH_PROMISE, on stream 0 and others, even and decreasing
stream identifiers. Each frame's octets go to the core (every path unary, each request answered
at once) and to `H2Connection(client_side=False)` (which answers the streams the core answers,
so that both agree on every stream's state), and each side's answer is classified: accepted, a
stream error with its code (RST_STREAM), or a connection error with its code (GOAWAY; h2's
ProtocolError). The classes must match. The core's answers to requests it does not take
(HTTP 405 and 415 for requests that are not gRPC, gRPC statuses for a compressed or a second
message, RST_STREAM NO_ERROR after its answer: §8.1) are answers, not errors: accepted, and h2
is made to end the stream the same way. The core's bounds (REFUSED_STREAM, budgets, floods) are
not reached: its default Limits, and scripts of a few dozen frames.

Where h2 departs from RFC 9113, or gRPC's rules make the core answer otherwise, the RFC wins:
DEPARTURES lists each case (its RFC section, one sentence why), and the comparison lets a
mismatch through only when one of them names the frame and the exact pair of answers. Each has
an example script that `test_each_departure_is_real` plays to that very departure. KNOWN_BUGS
are the core's own wrong answers, with failing tests in test_findings.py. The comparison ends
at the first connection error on either side, and after the client's GOAWAY (h2 then refuses
every frame: its connection state machine is closed, a choice RFC 9113 §6.8 does not make for
frames on the client's streams).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratelimit_sidecar.grpc_server.protocol import frames as f
from ratelimit_sidecar.grpc_server.protocol import states as s
from tests.unit.grpc_server.protocol.differential import (
    ACCEPTED,
    BAD_PREFACES,
    HEADER_VARIANTS,
    Client,
    Continuation,
    Core,
    Data,
    GoAway,
    Headers,
    Hyper,
    Outcome,
    Ping,
    Priority,
    PushPromise,
    Ref,
    RstStream,
    Script,
    Settings,
    Spec,
    Step,
    Unknown,
    WindowUpdate,
    connection_error,
    stream_error,
)

# -- the departures -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Departure:
    """A frame on which the core and h2 disagree, and the core gives the RFC's answer (or, for
    a known bug, the core's wrong answer). `example`: frames after the preface and SETTINGS
    whose last one shows it."""

    name: str
    rfc: str  # the section, and one sentence
    applies: Callable[[Step], bool]
    core: Outcome
    h2: tuple[Outcome, ...] | None  # None: whatever h2 makes of the frame itself
    example: tuple[Spec, ...]


PROTOCOL: Final = f.PROTOCOL_ERROR
STREAM_CLOSED: Final = f.STREAM_CLOSED
FRAME_SIZE: Final = f.FRAME_SIZE_ERROR
IDLE: Final = f"core:{s.STATE_NAMES[s.IDLE]}"
OPEN: Final = f"core:{s.STATE_NAMES[s.OPEN]}"
HALF_CLOSED_REMOTE: Final = f"core:{s.STATE_NAMES[s.HALF_CLOSED_REMOTE]}"
HALF_CLOSED_LOCAL: Final = f"core:{s.STATE_NAMES[s.HALF_CLOSED_LOCAL]}"
CLOSED: Final = f"core:{s.STATE_NAMES[s.CLOSED]}"
RESET_SENT: Final = f"core:{s.STATE_NAMES[s.RESET_SENT]}"


def tagged(*tags: str) -> Callable[[Step], bool]:
    return lambda step: bool(step.tags.intersection(tags))


def frame_in(kinds: tuple[type, ...], *states: str) -> Callable[[Step], bool]:
    """A frame of `kinds` on a stream the core had in one of `states` before it."""
    return lambda step: isinstance(step.spec, kinds) and bool(step.tags.intersection(states))


def request(variant: str = "grpc", ref: Ref = Ref.NEW, end_stream: bool = False) -> Headers:
    return Headers(ref, variant, end_stream, end_headers=True, padding=-1, priority="")


def message(end_stream: bool = True, ref: Ref = Ref.NEWEST) -> Data:
    return Data(ref, "message", 3, end_stream, padding=-1)


def malformed(rfc: str, *variants: str) -> Departure:
    """A malformed request: the RFC's stream error, h2's connection error."""
    return Departure(
        f"malformed request: {', '.join(variants)}",
        f"{rfc}; §8.1.1: a malformed request is a stream error PROTOCOL_ERROR (h2: connection "
        "error PROTOCOL_ERROR).",
        tagged(*variants),
        stream_error(PROTOCOL),
        (connection_error(PROTOCOL),),
        (request(variants[0]),),
    )


DEPARTURES: Final = (
    Departure(
        "preface not followed by SETTINGS",
        "§3.4: the client's preface is the magic then a SETTINGS frame; anything else is a "
        "connection error PROTOCOL_ERROR (h2 takes any first frame as it would later).",
        tagged("first_frame"),
        connection_error(PROTOCOL),
        None,
        (Ping(ack=False, length=8, ref=Ref.ZERO),),  # its example replaces the SETTINGS
    ),
    Departure(
        "a frame interrupting a header block",
        "§4.3, §6.10: any frame but the same stream's CONTINUATION inside a header block is a "
        "connection error PROTOCOL_ERROR, whatever the frame (h2 checks the frame itself first: "
        "FRAME_SIZE_ERROR for a short GOAWAY).",
        tagged("interrupts_block"),
        connection_error(PROTOCOL),
        None,
        (Headers(Ref.NEW, "grpc", False, False, -1, ""), GoAway(4, 0, Ref.ZERO)),
    ),
    Departure(
        "CONTINUATION outside a header block",
        "§6.10: a CONTINUATION not preceded by HEADERS or CONTINUATION without END_HEADERS is a "
        "connection error PROTOCOL_ERROR (h2 checks the stream first: STREAM_CLOSED on a "
        "closed one).",
        tagged("continuation_alone"),
        connection_error(PROTOCOL),
        None,
        (request(end_stream=True), request(), Continuation(Ref.LOWER, end_headers=True)),
    ),
    malformed("§8.2.1: field names are lowercase", "uppercase"),
    malformed("§8.2.2: no connection-specific field", "connection", "transfer_encoding"),
    malformed("§8.2.2: te carries nothing but trailers", "te_gzip"),
    malformed("§8.2.1: no NUL, CR or LF in a field value", "nul_value"),
    malformed(
        "§8.3.1: :method, :scheme and :path are required",
        "missing_method",
        "missing_path",
        "missing_scheme",
    ),
    malformed(
        "§8.3: each request pseudo-header once, none other, all before the regular fields",
        "duplicate_path",
        "unknown_pseudo",
        "status_pseudo",
        "pseudo_after_regular",
    ),
    malformed("§8.3.1: :path is not empty", "empty_path"),
    malformed("§8.3.1: host and :authority agree", "host_mismatch"),
    Departure(
        "malformed trailers",
        "§8.1, §8.3: trailers hold no pseudo-header (and §8.2.1: no uppercase name): the request "
        "is malformed, a stream error PROTOCOL_ERROR (h2: connection error).",
        tagged("trailers_pseudo", "trailers_uppercase"),
        stream_error(PROTOCOL),
        (connection_error(PROTOCOL),),
        (request(), message(False), request("missing_path", Ref.NEWEST, end_stream=True)),
    ),
    Departure(
        "trailers without END_STREAM",
        "§8.1: a HEADERS frame without END_STREAM after the request's header block makes the "
        "request malformed, a stream error PROTOCOL_ERROR (h2: connection error).",
        lambda step: {"trailers", "no_end_stream"} <= step.tags,
        stream_error(PROTOCOL),
        (connection_error(PROTOCOL),),
        (request(), message(False), request(ref=Ref.NEWEST)),
    ),
    Departure(
        "DATA unlike the content-length",
        "§8.1.1: DATA adding up to other than the request's content-length makes the request "
        "malformed, a stream error PROTOCOL_ERROR (h2: connection error, or nothing when "
        "HEADERS with END_STREAM declared a length above 0).",
        lambda step: "content_length" in step.tags,
        stream_error(PROTOCOL),
        (connection_error(PROTOCOL), ACCEPTED),
        (request("content_length_5"), message()),
    ),
    Departure(
        "self-dependent priority",
        "§5.3.1: a stream depending on itself is a stream error PROTOCOL_ERROR (h2: connection "
        "error).",
        lambda step: (
            "self_dependency" in step.tags
            and (isinstance(step.spec, Headers) or IDLE not in step.tags)
        ),
        stream_error(PROTOCOL),
        (connection_error(PROTOCOL),),
        (request(), Priority(Ref.NEWEST, "self", 5)),
    ),
    Departure(
        "PRIORITY of a length other than 5",
        "§6.3: a PRIORITY frame not of 5 octets is a stream error FRAME_SIZE_ERROR (h2: "
        "connection error).",
        lambda step: isinstance(step.spec, Priority) and IDLE not in step.tags,
        stream_error(FRAME_SIZE),
        (connection_error(FRAME_SIZE),),
        (request(), Priority(Ref.NEWEST, "zero", 4)),
    ),
    Departure(
        "WINDOW_UPDATE of 0 on a stream",
        "§6.9: a stream's WINDOW_UPDATE with an increment of 0 is a stream error "
        "PROTOCOL_ERROR (h2: connection error).",
        frame_in((WindowUpdate,), OPEN, HALF_CLOSED_REMOTE, HALF_CLOSED_LOCAL),
        stream_error(PROTOCOL),
        (connection_error(PROTOCOL),),
        (request(), WindowUpdate(Ref.NEWEST, 0, 4)),
    ),
    Departure(
        "WINDOW_UPDATE of 0 on a closed stream",
        "§5.1 (closed): WINDOW_UPDATE on a closed stream is ignored, as it may have crossed "
        "the frame that closed it (h2 checks the increment first: connection error).",
        frame_in((WindowUpdate,), CLOSED, RESET_SENT),
        ACCEPTED,
        (connection_error(PROTOCOL),),
        (request(), message(), WindowUpdate(Ref.NEWEST, 0, 4)),
    ),
    Departure(
        "SETTINGS ACK with a payload",
        "§6.5: a SETTINGS frame with ACK and a payload is a connection error FRAME_SIZE_ERROR "
        "(h2: PROTOCOL_ERROR).",
        lambda step: isinstance(step.spec, Settings) and step.spec.ack,
        connection_error(FRAME_SIZE),
        (connection_error(PROTOCOL),),
        (Settings(((f.SETTINGS_ENABLE_PUSH, 0),), ack=True, extra=0, ref=Ref.ZERO),),
    ),
    Departure(
        "an invalid SETTINGS value overridden in the same frame",
        "§6.5.2, §6.5.3: values are processed in order, each checked (a SETTINGS_MAX_FRAME_SIZE "
        "below 16,384 is a connection error PROTOCOL_ERROR) even if a later entry sets the "
        "parameter again (h2 keeps the last value of each parameter and checks it alone).",
        lambda step: isinstance(step.spec, Settings) and len(step.spec.entries) > 1,
        connection_error(PROTOCOL),
        (ACCEPTED,),
        (
            Settings(
                ((f.SETTINGS_MAX_FRAME_SIZE, 16_383), (f.SETTINGS_MAX_FRAME_SIZE, 16_384)),
                ack=False,
                extra=0,
                ref=Ref.ZERO,
            ),
        ),
    ),
    Departure(
        "an invalid SETTINGS_INITIAL_WINDOW_SIZE overridden in the same frame",
        "§6.5.2, §6.5.3: as above, a SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1 is a connection "
        "error FLOW_CONTROL_ERROR even if a later entry of the frame sets a valid one (h2 "
        "checks the last alone).",
        lambda step: isinstance(step.spec, Settings) and len(step.spec.entries) > 1,
        connection_error(f.FLOW_CONTROL_ERROR),
        (ACCEPTED,),
        (
            Settings(
                ((f.SETTINGS_INITIAL_WINDOW_SIZE, 2**31), (f.SETTINGS_INITIAL_WINDOW_SIZE, 1)),
                ack=False,
                extra=0,
                ref=Ref.ZERO,
            ),
        ),
    ),
    Departure(
        "a frame on a stream the server reset",
        "§5.1 (closed): after sending RST_STREAM an endpoint MUST minimally process and then "
        "discard the frames the peer had in flight on the stream (h2 answers DATA and HEADERS "
        "with STREAM_CLOSED).",
        frame_in((Data, Headers), RESET_SENT),
        ACCEPTED,
        (stream_error(STREAM_CLOSED), connection_error(STREAM_CLOSED)),
        (request(), Data(Ref.NEWEST, "compressed", 3, False, -1), message()),
    ),
    Departure(
        "HEADERS on a stream the client reset",
        "§5.1 (closed): an endpoint MAY treat any frame but PRIORITY on a closed stream as a "
        "connection error STREAM_CLOSED (h2 keeps RFC 7540's stream error after RST_STREAM).",
        frame_in((Headers,), CLOSED),
        connection_error(STREAM_CLOSED),
        (stream_error(STREAM_CLOSED),),
        (request(), RstStream(Ref.NEWEST, 8, 4), request(ref=Ref.NEWEST, end_stream=True)),
    ),
    Departure(
        "RST_STREAM on an idle stream",
        "§6.4, §5.1 (idle): RST_STREAM on an idle stream is a connection error PROTOCOL_ERROR "
        "(h2 ignores it).",
        frame_in((RstStream,), IDLE),
        connection_error(PROTOCOL),
        (ACCEPTED,),
        (request(), RstStream(Ref.NEW, 8, 4)),
    ),
    Departure(
        "ALTSVC from a client",
        "§5.5 and RFC 7838 §4: a server ignores ALTSVC (type 0xa) like any frame type it does "
        "not know (h2 parses it: FRAME_SIZE_ERROR for one too short).",
        lambda step: isinstance(step.spec, Unknown) and step.spec.kind == 0xA,
        ACCEPTED,
        (connection_error(FRAME_SIZE),),
        (Unknown(0xA, Ref.ZERO, 0),),
    ),
)
# Bugs of the core: its answer breaks the RFC. Each gets a failing test (xfail, strict) in
# test_findings.py and an entry here until fixed. The first (RST_STREAM on an idle stream for a
# bad PRIORITY) is fixed; test_findings.py keeps it so.
KNOWN_BUGS: Final[tuple[Departure, ...]] = ()

# -- the scripts --------------------------------------------------------------------------------

REFS: Final = st.sampled_from(list(Ref))
STREAM_REFS: Final = st.sampled_from([Ref.NEW] * 4 + [Ref.NEWEST] * 3 + list(Ref))
DATA_REFS: Final = st.sampled_from([Ref.NEWEST] * 6 + [Ref.OLDER] * 2 + list(Ref))
CODES: Final = st.sampled_from([0, 1, 2, 8, 0xFF])
PADDING: Final = st.sampled_from([-1] * 8 + [0, 1, 4, 16, 40, 255])  # -1: none
SETTING: Final = st.sampled_from([
    (f.SETTINGS_HEADER_TABLE_SIZE, 4096), (f.SETTINGS_HEADER_TABLE_SIZE, 0),
    (f.SETTINGS_ENABLE_PUSH, 0), (f.SETTINGS_ENABLE_PUSH, 1), (f.SETTINGS_ENABLE_PUSH, 2),
    (f.SETTINGS_MAX_CONCURRENT_STREAMS, 100), (f.SETTINGS_INITIAL_WINDOW_SIZE, 65_535),
    (f.SETTINGS_INITIAL_WINDOW_SIZE, 0), (f.SETTINGS_INITIAL_WINDOW_SIZE, 2**31 - 1),
    (f.SETTINGS_INITIAL_WINDOW_SIZE, 2**31), (f.SETTINGS_MAX_FRAME_SIZE, 16_384),
    (f.SETTINGS_MAX_FRAME_SIZE, 16_383), (f.SETTINGS_MAX_FRAME_SIZE, 2**24 - 1),
    (f.SETTINGS_MAX_FRAME_SIZE, 2**24), (f.SETTINGS_MAX_HEADER_LIST_SIZE, 8192),
    (0xFF, 7), (f.SETTINGS_ENABLE_CONNECT_PROTOCOL, 1),
])  # fmt: skip
VALID_SETTINGS: Final = Settings((), ack=False, extra=0, ref=Ref.ZERO)

HEADERS: Final = st.builds(
    Headers,
    ref=STREAM_REFS,
    variant=st.sampled_from(["grpc"] * 8 + list(HEADER_VARIANTS)),
    end_stream=st.booleans(),
    end_headers=st.sampled_from([True, True, True, False]),
    padding=PADDING,
    priority=st.sampled_from(["", "", "", "self", "other"]),
)
DATA: Final = st.builds(
    Data,
    ref=DATA_REFS,
    shape=st.sampled_from(["message", "message", "partial", "empty", "compressed", "two"]),
    size=st.integers(0, 100),
    end_stream=st.booleans(),
    padding=PADDING,
)
CONTROL: Final = st.one_of(
    st.builds(Continuation, ref=STREAM_REFS, end_headers=st.booleans()),
    st.builds(
        WindowUpdate,
        ref=REFS,
        increment=st.sampled_from([0, 1, 1000, 2**31 - 1]),
        length=st.sampled_from([4, 4, 4, 3]),
    ),
    st.builds(RstStream, ref=REFS, code=CODES, length=st.sampled_from([4, 4, 4, 5])),
    st.builds(
        Settings,
        entries=st.lists(SETTING, max_size=3).map(tuple),
        ack=st.booleans(),
        extra=st.sampled_from([0, 0, 0, 1]),
        ref=st.sampled_from([Ref.ZERO, Ref.ZERO, Ref.ZERO, Ref.NEWEST]),
    ),
    st.builds(
        Ping,
        ack=st.booleans(),
        length=st.sampled_from([8, 8, 8, 7]),
        ref=st.sampled_from([Ref.ZERO, Ref.ZERO, Ref.ZERO, Ref.NEWEST]),
    ),
    st.builds(
        Priority,
        ref=REFS,
        depends=st.sampled_from(["zero", "other", "self"]),
        length=st.sampled_from([5, 5, 5, 4]),
    ),
    st.builds(
        GoAway,
        length=st.sampled_from([8, 13, 4]),
        code=CODES,
        ref=st.sampled_from([Ref.ZERO, Ref.ZERO, Ref.ZERO, Ref.NEWEST]),
    ),
    st.builds(Unknown, kind=st.integers(10, 255), ref=REFS, length=st.integers(0, 8)),
    st.builds(PushPromise, ref=STREAM_REFS),
)
# A gRPC call's frames, often, so that the comparison goes deeper before a connection error
# ends it: a request and its messages (ending it or not), or trailers on the newest.
OPENING: Final = st.builds(
    Headers, st.just(Ref.NEW), st.just("grpc"), st.just(False), st.just(True), st.just(-1),
    st.just(""),
)  # fmt: skip
MESSAGE: Final = st.builds(
    Data, st.just(Ref.NEWEST), st.just("message"), st.integers(0, 50), st.booleans(), st.just(-1)
)
TRAILERS: Final = st.builds(
    Headers, st.just(Ref.NEWEST), st.sampled_from(["grpc", "uppercase", "get"]), st.booleans(),
    st.just(True), st.just(-1), st.just(""),
)  # fmt: skip
CALL: Final = st.one_of(
    st.tuples(OPENING, MESSAGE), st.tuples(OPENING, MESSAGE, MESSAGE), st.tuples(TRAILERS)
)
# one_of flattens nested one_ofs and picks a branch uniformly: weights by a drawn category.
KINDS: Final = {
    "call": CALL,
    "headers": HEADERS.map(lambda spec: (spec,)),
    "data": DATA.map(lambda spec: (spec,)),
    "control": CONTROL.map(lambda spec: (spec,)),
}
FRAMES: Final = st.sampled_from(
    ["call"] * 12 + ["headers"] * 3 + ["data"] * 3 + ["control"] * 4
).flatmap(KINDS.__getitem__)
FIRST: Final = st.sampled_from([True] * 19 + [False]).flatmap(
    lambda valid: st.just((VALID_SETTINGS,)) if valid else FRAMES
)
SCRIPTS: Final = st.builds(
    Script,
    preface=st.sampled_from([-1] * 60 + list(range(len(BAD_PREFACES)))),
    frames=st.tuples(FIRST, st.lists(FRAMES, min_size=2, max_size=16)).map(
        lambda drawn: tuple(spec for group in (drawn[0], *drawn[1]) for spec in group)
    ),
)

# -- the comparison -----------------------------------------------------------------------------


def compare(script: Script, met: Counter[str]) -> None:
    """Feed `script` to both servers; AssertionError at the first unexplained difference."""
    core, hyper, client = Core(), Hyper(), Client()
    preface = f.PREFACE if script.preface < 0 else BAD_PREFACES[script.preface]
    ours, _ = core.feed(preface)
    theirs = hyper.feed(preface)
    assert ours == theirs, f"preface {preface!r}: core {ours}, h2 {theirs}"
    if ours != ACCEPTED:
        met["bad preface"] += 1
        return
    for spec in script.frames:
        step = client.render(spec)
        step.tags.add(f"core:{s.STATE_NAMES[core.conn._state(step.stream_id)]}")
        ours, core_frames = core.feed(step.octets)
        theirs = hyper.feed(step.octets)
        if ours != theirs:
            departure = explain(step, core, ours, theirs)
            assert departure, f"{step}: core {ours}, h2 {theirs}"
            met[departure.name] += 1
            return
        met[repr(ours)] += 1
        if ours.kind == "connection" or isinstance(spec, GoAway) or core.conn.closing:
            return
        hyper.mirror(core_frames)


def explain(step: Step, core: Core, ours: Outcome, theirs: Outcome) -> Departure | None:
    for departure in (*DEPARTURES, *KNOWN_BUGS):
        allowed = departure.h2 is None or theirs in departure.h2
        if departure.core == ours and allowed and departure.applies(step):
            return departure
    return None


@settings(
    max_examples=600,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(SCRIPTS)
def test_core_and_h2_agree_frame_by_frame_but_where_the_rfc_says_otherwise(
    script: Script,
) -> None:
    compare(script, Counter())


@pytest.mark.parametrize("departure", [*DEPARTURES, *KNOWN_BUGS], ids=lambda d: d.name)
def test_each_departure_is_real(departure: Departure) -> None:
    """Its example ends in exactly that departure: the core and h2 do differ there."""
    frames = departure.example
    if departure is not DEPARTURES[0]:  # the first frame is the preface's SETTINGS
        frames = (VALID_SETTINGS, *frames)
    met: Counter[str] = Counter()
    compare(Script(-1, frames), met)
    assert met[departure.name] == 1, dict(met)

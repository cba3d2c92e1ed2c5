"""Request header blocks: RFC 9113 §8.2-§8.3's rules, gRPC's, and the decoded-block cache."""

from __future__ import annotations

import hpack
import pytest

from ratelimit_sidecar.grpc_server.protocol import responses
from ratelimit_sidecar.grpc_server.protocol.headers import HeaderBlocks
from ratelimit_sidecar.grpc_server.protocol.limits import Counters
from ratelimit_sidecar.grpc_server.protocol.validation import (
    MALFORMED,
    OVERSIZED,
    REFUSED,
    STREAMING,
    UNARY,
    grpc_timeout_s,
    request_head,
    trailers_problem,
)
from tests.unit.grpc_server.protocol.peer import STREAM_PATH, UNARY_PATH, request_fields, route

Fields = list[tuple[bytes, bytes]]


def raw(fields: list[tuple[str, str]]) -> Fields:
    return [(name.encode(), value.encode()) for name, value in fields]


def head_of(fields: Fields, max_list: int = 16_384) -> tuple[int, str]:
    head = request_head(fields, route, max_list)
    return head.kind, head.problem


GRPC = raw(request_fields())


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ([*GRPC, (b"X-Upper", b"v")], "not lowercase"),
        ([*GRPC, (b"", b"v")], "not lowercase"),
        ([*GRPC, (b"x space", b"v")], "not lowercase"),
        ([*GRPC, (b"x:colon", b"v")], "not lowercase"),
        ([*GRPC, (b"x-\xff", b"v")], "not lowercase"),
        ([*GRPC, (b"x-nul", b"a\0b")], "NUL, CR or LF"),
        ([*GRPC, (b"x-lf", b"a\nb")], "NUL, CR or LF"),
        ([*GRPC, (b"x-space", b" a")], "whitespace"),
        ([*GRPC, (b"x-tab", b"a\t")], "whitespace"),
        ([*GRPC, (b"connection", b"close")], "connection-specific"),
        ([*GRPC, (b"keep-alive", b"1")], "connection-specific"),
        ([*GRPC, (b"proxy-connection", b"x")], "connection-specific"),
        ([*GRPC, (b"transfer-encoding", b"chunked")], "connection-specific"),
        ([*GRPC, (b"upgrade", b"h2c")], "connection-specific"),
        ([*GRPC, (b"te", b"gzip")], "te"),
        ([*GRPC[:4], (b":status", b"200"), *GRPC[4:]], "is not a request's"),
        ([*GRPC[:4], (b":protocol", b"websocket"), *GRPC[4:]], "is not a request's"),
        ([*GRPC[:2], (b"x", b"y"), *GRPC[2:]], "after a regular field"),
        ([*GRPC[:1], *GRPC], "twice"),
        ([GRPC[0], GRPC[3], (b":authority", b"other"), *GRPC[1:3]], "twice"),
        ([(b":path", b"\r"), *GRPC[:2]], "NUL, CR or LF"),
        (GRPC[1:], "no :method"),
        ([GRPC[0], *GRPC[2:]], "no :scheme"),
        ([*GRPC[:2], *GRPC[3:]], "no :path"),
        ([*GRPC[:2], (b":path", b""), *GRPC[3:]], "an empty :path"),
        ([(b":method", b"CONNECT"), (b":authority", b"x"), (b":path", b"/")], "CONNECT"),
        ([*GRPC, (b"host", b"elsewhere")], "host and :authority differ"),
        ([*GRPC, (b"content-length", b"1x")], "content-length"),
        ([*GRPC, (b"content-length", b"1"), (b"content-length", b"2")], "content-length"),
    ],
)
def test_malformed_requests(fields: Fields, problem: str) -> None:
    kind, text = head_of(fields)
    assert kind == MALFORMED and problem in text


def test_a_grpc_request_is_well_formed() -> None:
    head = request_head([*GRPC, (b"content-length", b"7"), (b"host", b"localhost")], route, 16_384)
    assert (head.kind, head.path, head.content_length, head.timeout_s) == (
        UNARY,
        UNARY_PATH.encode(),
        7,
        -1.0,
    )
    assert head_of(raw(request_fields(STREAM_PATH)))[0] == STREAMING
    connect = [(b":method", b"CONNECT"), (b":authority", b"host:443")]
    assert head_of(connect)[0] == REFUSED  # well-formed, and not gRPC: 405


@pytest.mark.parametrize(
    ("content_type", "kind"),
    [
        (b"application/grpc", UNARY),
        (b"application/grpc+proto", UNARY),
        (b"application/grpc;charset=utf-8", UNARY),
        (b"application/grpcx", REFUSED),
        (b"application/json", REFUSED),
    ],
)
def test_the_content_type_says_grpc(content_type: bytes, kind: int) -> None:
    fields = [(n, content_type if n == b"content-type" else v) for n, v in GRPC]
    assert head_of(fields)[0] == kind


def test_refusals_carry_their_status() -> None:
    get = [(b":method", b"GET"), *GRPC[1:]]
    head = request_head(get, route, 16_384)
    assert head.refusal == responses.http_status_block(405) and head.body.startswith(b"405")
    unknown = request_head(raw(request_fields("/x.Y/Z")), route, 16_384)
    assert unknown.kind == REFUSED and b"unknown method /x.Y/Z" in unknown.refusal
    big = request_head([*GRPC, (b"x-big", b"v" * 100)], route, 100)
    assert (big.kind, big.problem, big.body) == (REFUSED, OVERSIZED, b"")
    assert b"grpc-status" in big.refusal
    big_get = request_head([*get, (b"x-big", b"v" * 100)], route, 100)
    assert big_get.refusal == responses.http_status_block(431)


def test_a_bad_grpc_timeout_is_internal() -> None:
    head = request_head([*GRPC, (b"grpc-timeout", b"soon")], route, 16_384)
    assert head.kind == REFUSED and b"bad grpc-timeout soon" in head.refusal


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"100m", 0.1), (b"2S", 2.0), (b"1H", 3600.0), (b"3M", 180.0), (b"5u", 5e-6),
        (b"7n", 7e-9), (b"7", -1.0), (b"x1m", -1.0), (b"123456789S", -1.0), (b"", -1.0),
    ],
)  # fmt: skip
def test_grpc_timeout_units(value: bytes, seconds: float) -> None:
    assert grpc_timeout_s(value) == pytest.approx(seconds)


def test_trailers_carry_no_pseudo_header_and_follow_the_field_rules() -> None:
    assert trailers_problem([(b"x-end", b"1")]) == ""
    assert "pseudo-header" in trailers_problem([(b":path", b"/")])
    assert "not lowercase" in trailers_problem([(b"X-End", b"1")])


def test_a_repeated_block_is_decoded_once_until_the_table_changes() -> None:
    encoder, blocks = hpack.Encoder(), HeaderBlocks(route, 16_384, 65_536, Counters())
    fields = request_fields(extra=[("x-key", "one")])
    blocks.request(encoder.encode(fields))  # adds the fields to the dynamic table
    repeat = encoder.encode(fields)  # indices only
    once = blocks.request(repeat)
    assert blocks.request(repeat) is once
    blocks.request(encoder.encode([*fields, ("x-other", "two")]))  # a new entry: indices shift
    again = blocks.request(repeat)
    assert again is not once and (b"x-key", b"one") in again.headers

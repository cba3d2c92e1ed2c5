"""The hand-written response encoding, checked field by field by the generated protobuf classes."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.config.model import RateLimit, Unit
from ratelimit_sidecar.core import Code, Decision, Verdict
from ratelimit_sidecar.service.response import (
    UNLIMITED_REMAINING,
    ResponseEncoder,
    ResponseOptions,
    unmatched_response,
    varint,
)

limits = st.builds(
    RateLimit,
    requests_per_unit=st.integers(0, 2**32 - 1),
    unit=st.sampled_from([u for u in Unit if u is not Unit.UNKNOWN]),
    unit_multiplier=st.integers(1, 1000),
    name=st.text(max_size=20),
)
verdicts = st.builds(
    Verdict,
    code=st.sampled_from(Code),
    limit=st.none() | limits,
    unlimited=st.booleans(),
    remaining=st.integers(0, 2**32 - 1),
    reset_ms=st.integers(0, 10**10),
    shadow=st.booleans(),
)


@given(st.lists(verdicts, min_size=1, max_size=8), st.booleans())
def test_encoded_responses_parse_to_the_intended_fields(items: list[Verdict], ietf: bool) -> None:
    over = any(v.code is Code.OVER_LIMIT for v in items)
    decision = Decision(Code.OVER_LIMIT if over else Code.OK, tuple(items))
    reply = wire.RateLimitResponse.FromString(
        ResponseEncoder(ResponseOptions(ietf)).encode(decision)
    )
    assert reply.overall_code == (wire.Code.OVER_LIMIT if over else wire.Code.OK)
    assert len(reply.statuses) == len(items)
    for verdict, status in zip(items, reply.statuses, strict=True):
        _check_status(verdict, status)
    headers = {h.key: h.value for h in reply.response_headers_to_add}
    assert ("retry-after" in headers) == over
    assert bool(reply.raw_body) == over
    if over:
        assert json.loads(reply.raw_body)["error"]["code"] == "RATE_LIMITED"


def _check_status(verdict: Verdict, status: wire.DescriptorStatus) -> None:
    # Shadow rules are reported like the others (the limiter answers them OK when over).
    assert status.code == int(verdict.code)
    limit = verdict.limit
    if limit is None:
        assert not status.HasField("current_limit")
        assert status.limit_remaining == (UNLIMITED_REMAINING if verdict.unlimited else 0)
        return
    current = status.current_limit
    assert (current.requests_per_unit, current.unit, current.name) == (
        limit.requests_per_unit,
        int(limit.unit),
        limit.name,
    )
    assert current.unit_multiplier.value == (
        limit.unit_multiplier if limit.unit_multiplier > 1 else 0
    )
    assert status.limit_remaining == verdict.remaining
    assert status.HasField("duration_until_reset")
    # Whole seconds, rounded up like Retry-After: Envoy's x-ratelimit-reset reads only seconds.
    assert status.duration_until_reset.seconds == -(-verdict.reset_ms // 1000)
    assert status.duration_until_reset.nanos == 0


def test_reset_is_whole_seconds_rounded_up_on_admitted_and_refused_statuses() -> None:
    encoder, limit = ResponseEncoder(), RateLimit(5, Unit.SECOND)
    admitted = Verdict(Code.OK, limit, remaining=3, reset_ms=54)
    refused = Verdict(Code.OVER_LIMIT, limit, reset_ms=946)

    ok = wire.RateLimitResponse.FromString(encoder.encode(Decision(Code.OK, (admitted,))))
    over = wire.RateLimitResponse.FromString(encoder.encode(Decision(Code.OVER_LIMIT, (refused,))))

    assert ok.statuses[0].duration_until_reset.ToMilliseconds() == 1000
    assert over.statuses[0].duration_until_reset.ToMilliseconds() == 1000
    headers = {h.key: h.value for h in over.response_headers_to_add}
    assert headers["retry-after"] == "1"


def test_a_shadow_rule_reports_its_limit_remaining_and_reset() -> None:
    limit = RateLimit(10, Unit.MINUTE)
    verdict = Verdict(Code.OK, limit, remaining=7, reset_ms=30_000, shadow=True)

    ok = ResponseEncoder().encode(Decision(Code.OK, (verdict,)))
    [status] = wire.RateLimitResponse.FromString(ok).statuses

    assert (status.code, status.current_limit.requests_per_unit) == (wire.Code.OK, 10)
    assert (status.limit_remaining, status.duration_until_reset.seconds) == (7, 30)


def test_unknown_domain_answer() -> None:
    reply = wire.RateLimitResponse.FromString(unmatched_response(3))
    assert reply.overall_code == wire.Code.OK
    assert [s.code for s in reply.statuses] == [wire.Code.OK] * 3


@given(st.integers(0, 2**64 - 1))
def test_varint_matches_protobuf(value: int) -> None:
    from google.protobuf.wrappers_pb2 import UInt64Value

    assert b"\x08" + varint(value) == UInt64Value(value=value).SerializeToString() or value == 0

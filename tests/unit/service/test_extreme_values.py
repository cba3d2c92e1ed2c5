"""Hits, remaining and counts stay in the protocol's ranges, whatever a client sends: every
answer parses, and re-encodes to the same bytes (a value past uint32 would not)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.answer import answer_now
from harness.grpc_client import request
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.core import FleetLimiter, LocalLimiter
from ratelimit_sidecar.service.ratelimit import RateLimitHandler
from ratelimit_sidecar.service.validation import InvalidRequest

T0 = 1_700_000_040_000
UINT32 = 2**32 - 1
RULES = """\
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: huge
    rate_limit: {unit: second, requests_per_unit: 4294967295}
"""
FIXTURE_OK = [HealthCheck.function_scoped_fixture]
EXTREMES = st.sampled_from([0, 1, 2, 5, 2**31, UINT32, 2**32, 2**63, 2**64 - 1])
# One request: (descriptor key, hits_addend, is_negative_hits, per-request override)
REQUESTS = st.tuples(
    st.sampled_from(["user", "huge"]),
    EXTREMES,
    st.booleans(),
    st.one_of(st.none(), st.sampled_from([0, 1, UINT32])),
)


def encode(key: str, hits: int, negative: bool, override: int | None) -> bytes:
    message = request("d", [(key, "v")], descriptor_hits=[hits])
    message.descriptors[0].is_negative_hits = negative
    if override is not None:
        message.descriptors[0].limit.requests_per_unit = override
        message.descriptors[0].limit.unit = wire.RateLimitUnit.SECOND
    return message.SerializeToString()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(REQUESTS, min_size=1, max_size=30), st.booleans())
def test_every_answer_to_extreme_hits_is_in_range(
    tmp_path: Path, script: list[tuple[str, int, bool, int | None]], local: bool
) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(RULES)
    limiter = LocalLimiter() if local else FleetLimiter()
    handler = RateLimitHandler(load_rules(path), limiter, lambda: T0)
    for key, hits, negative, override in script:
        raw = answer_now(handler, encode(key, hits, negative, override))
        answer = wire.RateLimitResponse.FromString(raw)
        assert answer.SerializeToString() == raw
        for status in answer.statuses:
            assert 0 <= status.limit_remaining <= UINT32
    for state in limiter.keys:
        assert state.window_counts().seen + state.inflight + state.pending >= 0  # never below zero


VALID = encode("user", 1, False, None)


def _mutated(patch: bytes, at: int) -> bytes:
    """A valid request with some bytes overwritten, or cut short."""
    return (VALID[:at] + patch + VALID[at + len(patch) :])[: max(1, at + len(patch))]


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.one_of(
        st.binary(max_size=200), st.builds(_mutated, st.binary(max_size=8), st.integers(0, 60))
    )
)
def test_any_bytes_get_an_answer_or_invalid_argument(tmp_path: Path, raw: bytes) -> None:
    """Malformed, truncated or random request bytes: a parseable answer or InvalidRequest
    (the servicer's INVALID_ARGUMENT), never another exception."""
    path = tmp_path / "d.yaml"
    path.write_text(RULES)
    handler = RateLimitHandler(load_rules(path), LocalLimiter(), lambda: T0)
    try:
        answer = answer_now(handler, raw)
    except InvalidRequest:
        return
    wire.RateLimitResponse.FromString(answer)

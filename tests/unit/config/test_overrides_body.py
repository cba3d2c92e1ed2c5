"""Override bodies of the admin API: what is accepted, and the reason for what is not."""

from __future__ import annotations

import pytest

from ratelimit_sidecar.config.model import AlgorithmName, RuleDefaults, Unit
from ratelimit_sidecar.overrides.model import (
    OverrideBounds,
    OverrideError,
    override_id,
    parse_override,
)

BOUNDS = OverrideBounds(max_entries=4, max_value_bytes=16)
BODY = {
    "domain": "gateway",
    "descriptor": [{"key": "api_key", "value": "tk_1"}],
    "rate_limit": {"unit": "minute", "requests_per_unit": 500},
    "expires_at": "2026-12-01T00:00:00Z",
    "note": "upgraded to pro",
}


def _with(**changes: object) -> dict[str, object]:
    return {**BODY, **changes}


def test_a_body_becomes_its_rule_and_document() -> None:
    override = parse_override(BODY, BOUNDS)

    assert override.entries == (("api_key", "tk_1"),)
    assert override.rule.limit is not None
    assert (override.rule.limit.requests_per_unit, override.rule.limit.unit) == (500, Unit.MINUTE)
    assert override.expires_at_ms == 1_796_083_200_000
    assert override.document == {"id": override.id, **BODY}
    assert override.rule.id == f"gateway.override_{override.id}"  # no value in metric labels
    assert "tk_1" not in override.rule.id


def test_the_id_depends_on_domain_and_descriptor_alone() -> None:
    other_limit = parse_override(_with(rate_limit={"unit": "hour", "requests_per_unit": 1}), BOUNDS)

    assert other_limit.id == parse_override(BODY, BOUNDS).id
    assert override_id("gateway", (("api_key", "tk_2"),)) != other_limit.id
    assert override_id("other", (("api_key", "tk_1"),)) != other_limit.id


@pytest.mark.parametrize(
    ("rate_limit", "check"),
    [
        ({"unlimited": True}, lambda o: o.rule.unlimited and o.rule.limit is None),
        ({"unit": "second", "requests_per_unit": 0}, lambda o: o.rule.limit.requests_per_unit == 0),
        (
            {"unit": "second", "requests_per_unit": 5, "algorithm": "token_bucket", "burst": 20},
            lambda o: (
                (o.rule.limit.algorithm, o.rule.limit.burst) == (AlgorithmName.TOKEN_BUCKET, 20)
            ),
        ),
        (
            {"unit": "minute", "unit_multiplier": 5, "requests_per_unit": 9},
            lambda o: o.rule.limit.window_ms == 300_000,
        ),
    ],
)
def test_rate_limit_takes_the_rule_files_keys(rate_limit: object, check: object) -> None:
    override = parse_override(_with(rate_limit=rate_limit), BOUNDS)

    assert callable(check) and check(override)


def test_several_limits_as_rate_limits() -> None:
    body = {k: v for k, v in BODY.items() if k != "rate_limit"}
    body["rate_limits"] = [
        {"unit": "second", "requests_per_unit": 5},
        {"unit": "day", "requests_per_unit": 1000},
    ]

    assert len(parse_override(body, BOUNDS).rule.limits) == 2


def test_expiry_is_optional_and_normalised_to_utc() -> None:
    never = parse_override({k: v for k, v in BODY.items() if k != "expires_at"}, BOUNDS)
    offset = parse_override(_with(expires_at="2026-12-01t00:00:00.250+00:00"), BOUNDS)

    assert never.expires_at_ms is None and not never.expired(2**62)
    assert offset.document["expires_at"] == "2026-12-01T00:00:00.250Z"
    assert offset.expired(1_796_083_200_250) and not offset.expired(1_796_083_200_249)
    micro = parse_override(_with(expires_at="2026-12-01T00:00:00.123999Z"), BOUNDS)
    assert micro.expires_at_ms == 1_796_083_200_123


def test_a_sliding_log_cannot_be_shared_through_redis_as_in_rule_files() -> None:
    body = _with(rate_limit={"unit": "second", "requests_per_unit": 5, "algorithm": "sliding_log"})
    shared = OverrideBounds(defaults=RuleDefaults(shared_store=True))

    with pytest.raises(OverrideError, match=r"rate_limit\.algorithm: sliding_log"):
        parse_override(body, shared)


BAD = [
    ([], "must be a JSON object"),
    (_with(extra=1), "unknown key 'extra'"),
    (_with(domain=""), "domain: required"),
    (_with(domain=5), "domain: required"),
    (_with(descriptor=[]), "descriptor: required, a non-empty list"),
    (_with(descriptor={"key": "a"}), "descriptor: required"),
    (_with(descriptor=[{"key": "a", "value": str(i)} for i in range(5)]), "--max-entries"),
    (_with(descriptor=[{"key": "a", "value": "x" * 17}]), r"descriptor\[0\].value: longer"),
    (_with(descriptor=[{"key": "", "value": "x"}]), r"descriptor\[0\].key: required"),
    (_with(descriptor=[{"key": "a"}]), r"descriptor\[0\].value: required"),
    (_with(descriptor=[{"key": "a", "value": 1}]), r"descriptor\[0\].value: required"),
    (_with(descriptor=[{"key": "a", "value": "b", "x": 1}]), "unknown key 'x'"),
    (_with(descriptor=["a"]), "must be an object"),
    ({k: v for k, v in BODY.items() if k != "rate_limit"}, "rate_limit: required"),
    (_with(rate_limit=None), "rate_limit: must not be empty"),
    (_with(rate_limit="fast"), "rate_limit: must be a mapping"),
    (_with(rate_limit={"unit": "fortnight", "requests_per_unit": 1}), "invalid unit 'fortnight'"),
    (_with(rate_limit={"unit": "minute"}), None),  # requests_per_unit missing = 0, as in files
    (_with(rate_limit={"requests_per_unit": 1}), "rate_limit.unit: required key is missing"),
    (_with(rate_limit={"unit": "minute", "requests_per_unit": -1}), "from 0 to 4294967295"),
    (_with(rate_limit={"unit": "minute", "requests_per_unit": 2**32}), "from 0 to 4294967295"),
    (_with(rate_limit={"unit": "minute", "requests_per_unit": 1.5}), "must be an integer"),
    (_with(rate_limit={"unit": "minute", "requests_per_unit": "5"}), "must be an integer"),
    (_with(rate_limit={"unit": "minute", "requests_per_unit": True}), "must be an integer"),
    (_with(rate_limit={"unit": "minute", "requests_per_unit": 5, "bogus": 1}), "rate_limit.bogus"),
    (_with(rate_limit={"unit": "minute", "requests_per_unit": 5, "burst": 9}), "token_bucket"),
    (_with(rate_limit={"unlimited": True, "unit": "minute"}), "must not be set when unlimited"),
    (_with(rate_limit={"unit": "minute", "requests_per_unit": 5, "algorithm": "x"}), "unknown"),
    (_with(rate_limit={"unit": "second", "requests_per_unit": 5, "spans": 100}), "spans"),
    (_with(rate_limit={"unit": "hour", "requests_per_unit": 5, "spans": 10**8}), "from 2 to 3600"),
    (
        _with(rate_limit={"unit": "year", "requests_per_unit": 5, "unit_multiplier": 2}),
        r"unit_multiplier: window of 730 days",
    ),
    (_with(expires_at="2026-12-01"), "expires_at: must be an RFC 3339 time"),
    (_with(expires_at="2026-12-01T00:00:00"), "must be in UTC"),
    (_with(expires_at="2026-12-01T00:00:00+01:00"), "must be in UTC"),
    (_with(expires_at="2026-13-01T00:00:00Z"), "not an RFC 3339 time"),
    (_with(expires_at=1796083200), "expires_at: must be"),
    (_with(note=5), "note: must be a string"),
    (_with(note="n" * 1025), "note: longer than 1024"),
]


@pytest.mark.parametrize(("body", "reason"), BAD)
def test_a_bad_body_is_refused_with_its_reason(body: object, reason: str | None) -> None:
    if reason is None:
        assert parse_override(body, BOUNDS).rule.limit is not None
        return
    with pytest.raises(OverrideError, match=reason):
        parse_override(body, BOUNDS)

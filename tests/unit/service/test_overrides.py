"""A request's own limit (Envoy's RateLimitOverride), as the reference applies it: to any
descriptor of a known domain, as a limit of its own (no shadow or quota mode, no multiplier)."""

from __future__ import annotations

from pathlib import Path

from harness.answer import answer_now
from harness.grpc_client import request
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.config import load_rules
from ratelimit_sidecar.core import LocalLimiter
from ratelimit_sidecar.service.ratelimit import RateLimitHandler

T0 = 1_700_000_040_000
OK, OVER = wire.Code.OK, wire.Code.OVER_LIMIT
RULES = """\
domain: d
descriptors:
  - key: trial
    shadow_mode: true
    quota_mode: true
    metadata: {plan: trial}
    rate_limit: {unit: second, unit_multiplier: 5, requests_per_unit: 100}
"""


def _handler(tmp_path: Path) -> RateLimitHandler:
    (tmp_path / "d.yaml").write_text(RULES)
    return RateLimitHandler(load_rules(tmp_path / "d.yaml"), LocalLimiter(), lambda: T0)


def _overridden(*entries: tuple[str, str]) -> bytes:
    message = request("d", list(entries))
    message.descriptors[0].limit.requests_per_unit = 1
    message.descriptors[0].limit.unit = wire.RateLimitUnit.MINUTE
    return message.SerializeToString()


def test_an_override_on_a_shadow_rule_is_enforced_over_the_override_unit_alone(
    tmp_path: Path,
) -> None:
    h = _handler(tmp_path)
    replies = [
        wire.RateLimitResponse.FromString(answer_now(h, _overridden(("trial", "t")))) for _ in "ab"
    ]

    assert [r.overall_code for r in replies] == [OK, OVER]
    limit = replies[0].statuses[0].current_limit
    assert (limit.requests_per_unit, limit.unit) == (1, wire.Unit.MINUTE)
    assert not limit.HasField("unit_multiplier")


def test_an_override_without_a_matching_rule_counts_per_descriptor(tmp_path: Path) -> None:
    h = _handler(tmp_path)
    first, second = (
        wire.RateLimitResponse.FromString(answer_now(h, _overridden(("other", "x")))) for _ in "ab"
    )
    elsewhere = wire.RateLimitResponse.FromString(answer_now(h, _overridden(("other", "y"))))

    assert (first.overall_code, second.overall_code, elsewhere.overall_code) == (OK, OVER, OK)
    assert first.statuses[0].current_limit.requests_per_unit == 1

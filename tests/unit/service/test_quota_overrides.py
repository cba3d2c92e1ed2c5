"""RLQS buckets follow the runtime overrides as ShouldRateLimit requests do: the override's rule
replaces the rule files', on the same counter, and a change applies at the next report."""

from __future__ import annotations

from pathlib import Path

from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.core import LocalLimiter
from ratelimit_sidecar.core.quota_assign import Action
from ratelimit_sidecar.overrides.applied import NO_OVERRIDES, AppliedOverrides
from ratelimit_sidecar.overrides.model import OverrideBounds, parse_override
from ratelimit_sidecar.service.quota import QuotaService, Usage
from ratelimit_sidecar.service.ratelimit import _key

T0 = 1_700_000_040_000
RULES = """\
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
"""


def _override(value: str, per_minute: int, domain: str = "d") -> AppliedOverrides:
    body = {
        "domain": domain,
        "descriptor": [{"key": "user", "value": value}],
        "rate_limit": {"unit": "minute", "requests_per_unit": per_minute},
    }
    return AppliedOverrides.of([parse_override(body, OverrideBounds())], 1)


def test_a_bucket_takes_the_override_and_its_changes(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(RULES)
    rules = load_rules(path)
    applied = [NO_OVERRIDES]
    service = QuotaService(lambda: rules, LocalLimiter(), lambda: T0, overrides=lambda: applied[0])
    stream = service.open_stream()
    bucket = (("user", "a"),)

    stream.report("d", [Usage({"user": "a"}, 5, 0)])
    tracked = stream._buckets[bucket]
    assert tracked.rule is not None and tracked.rule.limit is not None
    assert tracked.rule.limit.requests_per_unit == 2
    assert tracked.quota.sent is not None and tracked.quota.sent.action is Action.DENY_ALL

    applied[0] = _override("a", 1000)
    stream.report("d", [Usage({"user": "a"}, 0, 0)])
    tracked = stream._buckets[bucket]
    assert tracked.rule is not None and tracked.rule.limit is not None
    assert tracked.rule.limit.requests_per_unit == 1000
    assert tracked.key == _key("d", [("user", "a")], tracked.rule)  # ShouldRateLimit's counter
    assert tracked.quota.sent is not None and tracked.quota.sent.action is not Action.DENY_ALL

    applied[0] = NO_OVERRIDES  # deleted: the rule files' limit again
    stream.report("d", [Usage({"user": "a"}, 0, 0)])
    rule = stream._buckets[bucket].rule
    assert rule is not None and rule.limit is not None and rule.limit.requests_per_unit == 2


def test_a_domain_known_only_by_an_override_is_limited(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(RULES)
    rules = load_rules(path)
    applied = _override("b", 7, domain="other")
    stream = QuotaService(
        lambda: rules, LocalLimiter(), lambda: T0, overrides=lambda: applied
    ).open_stream()

    stream.report("other", [Usage({"user": "b"}, 1, 0)])

    rule = stream._buckets[(("user", "b"),)].rule
    assert rule is not None and rule.limit is not None and rule.limit.requests_per_unit == 7

"""The penalty metrics, read from a limiter on a fake clock."""

from __future__ import annotations

from ratelimit_sidecar.config.model import Penalty, RateLimit, Rule, Unit
from ratelimit_sidecar.core import LocalLimiter
from ratelimit_sidecar.http_server.endpoints import rule_view
from ratelimit_sidecar.metrics import Metrics
from tests.unit.core.rules import hit

T0 = 1_700_000_040_000


def test_offences_and_keys_by_level_are_exported() -> None:
    penalty = Penalty(2.0, 8000, 30_000)
    limit = RateLimit(2, Unit.SECOND, spans=2, cooldown_ms=1000, penalty=penalty)
    rule = Rule("d", (("k", ""),), limit)
    limiter, metrics, now = LocalLimiter(), Metrics(), [T0]
    metrics.watch(limiter, lambda: True, lambda: now[0])
    for at in range(T0, T0 + 3000, 50):  # two blocks, each offended
        limiter.hit(at, [hit(rule, "hammer")])
    limiter.hit(T0, [hit(rule, "quiet")])
    now[0] = T0 + 3000

    samples = {
        (s.name, s.labels.get("level", "")): s.value
        for family in metrics.registry.collect()
        for s in family.samples
    }

    assert samples[("ratelimit_sidecar_penalties_applied_total", "")] == 2
    assert samples[("ratelimit_sidecar_keys_under_penalty", "2")] == 1
    assert ("ratelimit_sidecar_keys_under_penalty", "1") not in samples


def test_debug_rules_show_a_limit_s_penalty() -> None:
    penalty = Penalty(2.0, 8000, 30_000)
    rule = Rule("d", (("k", ""),), RateLimit(2, Unit.SECOND, cooldown_ms=1000, penalty=penalty))
    limit = rule_view(rule)["limit"]
    assert isinstance(limit, dict)
    assert limit["penalty"] == {"factor": 2.0, "max_ms": 8000, "forgive_after_ms": 30_000}

"""Small rule builders for core tests."""

from __future__ import annotations

from ratelimit_sidecar.config.model import RateLimit, Rule, Unit
from ratelimit_sidecar.core import Hit


def rule(
    rpu: int = 10,
    *,
    unit: Unit = Unit.SECOND,
    spans: int = 2,
    cooldown_ms: int = 0,
    shadow: bool = False,
    multiplier: int = 1,
    key: str = "k",
) -> Rule:
    limit = RateLimit(rpu, unit, multiplier, spans=spans, cooldown_ms=cooldown_ms)
    return Rule("d", ((key, ""),), limit, shadow_mode=shadow)


def hit(r: Rule | None, value: str = "v", hits: int = 1) -> Hit:
    key = ("d", r.path[0][0] if r is not None and r.path else "k", value)
    return Hit(r, key, hits)

"""`near_limit` follows the configured ratio (the reference's NEAR_LIMIT_RATIO), every algorithm."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.config.model import AlgorithmName, RuleDefaults
from ratelimit_sidecar.core import LocalLimiter
from tests.unit.core.rules import hit, rule

T0 = 1_000_000_000_000


@pytest.mark.parametrize("algorithm", list(AlgorithmName))
@pytest.mark.parametrize(("ratio", "first_near"), [(0.8, 8), (0.5, 5), (1.0, 10)])
def test_near_limit_from_the_ratio_of_the_limit_used(
    algorithm: AlgorithmName, ratio: float, first_near: int
) -> None:
    r = rule(10)
    assert r.limit is not None
    r = replace(r, limit=replace(r.limit, algorithm=algorithm, near_limit_ratio=ratio), limits=())
    limiter = LocalLimiter()
    near = [limiter.hit(T0, [hit(r)]).verdicts[0].near_limit for _ in range(10)]  # no refill
    assert near.index(True) + 1 == first_near  # the first admitted answer at or past the ratio
    assert all(near[first_near - 1 :])


def test_rule_files_take_the_ratio_from_the_settings(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "r.yaml"
    limit = "rate_limit: {unit: second, requests_per_unit: 4}"
    path.write_text(f"domain: d\ndescriptors:\n  - key: k\n    {limit}\n")
    rules = load_rules(path, defaults=RuleDefaults(near_limit_ratio=0.5))
    (only,) = rules.domains["d"].rules()
    assert only.limit is not None and only.limit.near_limit_ratio == 0.5

"""The local fixed window decides as the exact reference (simulate/exact/fixed_window.py), the
one the integration tests measure a real sidecar against."""

from __future__ import annotations

import pytest

from ratelimit_sidecar.config.model import RateLimit, Rule, Unit
from ratelimit_sidecar.core import Code, LocalLimiter
from simulator.exact.fixed_window import ExactFixedWindow
from tests.unit.core.rules import hit
from tests.unit.core.trailing import random_trace


def fixed_rule(rpu: int, *, cooldown_ms: int = 0, window_end: bool = False) -> Rule:
    limit = RateLimit(
        rpu, Unit.SECOND, spans=4, cooldown_ms=cooldown_ms, cooldown_window_end=window_end
    )
    return Rule("d", (("k", ""),), limit)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("cooldown_ms", "window_end"), [(0, False), (300, False), (0, True)], ids=str
)
def test_local_decisions_equal_the_exact_fixed_window(
    seed: int, cooldown_ms: int, window_end: bool
) -> None:
    rpu = [1, 6, 25][seed % 3]
    r = fixed_rule(rpu, cooldown_ms=cooldown_ms, window_end=window_end)
    assert r.limit is not None
    exact = ExactFixedWindow(rpu, 1000, None if window_end else r.limit.cooldown)
    limiter = LocalLimiter()
    for now, hits in random_trace(seed, 600, mean_gap_ms=30):
        verdict = limiter.hit(now, [hit(r, hits=hits)]).verdicts[0]
        assert (verdict.code is Code.OK) == exact.hit(now, hits), (now, hits)

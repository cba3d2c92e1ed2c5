"""Accuracy properties of the shipped core, measured by the simulator on a virtual clock."""

from __future__ import annotations

import pytest

from tests.unit.simulator.helpers import run


@pytest.mark.parametrize("system", ["core", "exact", "local"])
def test_under_limit_bursty_traffic_is_never_rejected(system: str) -> None:
    # 0.6 x MAX per window on average, half of it packed into one-span bursts: every true
    # window stays under MAX, so any rejection is a false one.
    rec, setup = run(system, scenario="bursty", windows=60)
    assert max(rec.admitted) < setup.params.max  # the scenario really is under the limit
    assert rec.eligible == sum(rec.offered)
    assert rec.false_rejections == 0


def test_nodes_joining_and_leaving_under_the_limit_reject_nothing() -> None:
    rec, _ = run("core", scenario="churn", load=0.7, windows=60)
    assert rec.false_rejections == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_skewed_balancer_at_half_the_limit_rejects_nothing(seed: int) -> None:
    # 60/30/10: the 10% node sees a few requests per span, each standing for ~10 of the fleet.
    rec, setup = run("core", scenario="skewed_under", load=0.5, windows=60, seed=seed)
    assert max(rec.offered) < setup.params.max
    assert rec.false_rejections == 0


UNDER_LIMIT = [
    ("skewed_under", 0.9),
    ("near_limit", 0.95),
    ("steady", 0.8),
    ("skewed", 0.8),
    ("latency", 0.8),
    ("churn", 0.8),
]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(("scenario", "load"), UNDER_LIMIT)
def test_close_to_the_limit_nothing_is_falsely_rejected(
    scenario: str, load: float, seed: int
) -> None:
    """Zero false rejections under the limit, up to 0.95 x MAX.

    The estimate extrapolates this node's unpushed hits to the fleet; Poisson noise x nodes
    passes MAX near the end of windows that end under it. A window whose pace keeps it under
    MAX x (1 + 1/N) lets the estimate pass MAX by MAX / N, or by 3 sd of that noise
    (docs/ACCURACY.md, decision (i))."""
    rec, _ = run("core", scenario=scenario, load=load, windows=60, seed=seed)
    assert rec.false_rejections == 0


@pytest.mark.parametrize(("scenario", "load"), [("skewed_under", 0.9), ("near_limit", 0.95)])
def test_the_strict_check_refuses_requests_on_the_same_traffic(scenario: str, load: float) -> None:
    # What the lenient ceiling removes: the check before it refused requests near the limit.
    strict = [run("strict", scenario=scenario, load=load, windows=60, seed=s)[0] for s in (1, 2, 3)]
    assert sum(r.false_rejections for r in strict) > 0


@pytest.mark.parametrize("seed", [6, 8, 11])
def test_a_small_share_node_near_the_limit_rejects_nothing(seed: int) -> None:
    # Seeds where the 10% node's estimate (x ~10) passed MAX + MAX / N in a window that ended
    # under MAX: the lenient ceiling is widened to 3 sd of that node's extrapolation noise.
    rec, _ = run("core", scenario="skewed_under", load=0.9, seed=seed)
    assert rec.false_rejections == 0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_steady_over_limit_even_split_stays_within_one_span_share(seed: int) -> None:
    """Each window admits at most MAX x (1 + 1/N) at twice the limit on 4 nodes.

    A statistical bound, not a guarantee: over seeds 1-20 (2000 windows) the worst is 278; the
    push-order staleness of `seen` plus noise in the `nodes` estimates can pass it
    (docs/ACCURACY.md)."""
    rec, setup = run("core", scenario="steady", seed=seed)
    exact, _ = run("exact", scenario="steady", seed=seed)
    p = setup.params
    assert min(rec.offered) > 1.5 * p.max  # really over the limit, every window
    assert max(rec.admitted) <= p.max * (1 + 1 / p.spans)
    # ... and not by starving the key: close to the ideal counter with the same cooldown.
    assert sum(rec.admitted) >= 0.8 * sum(exact.admitted)


def test_exact_counter_baseline_never_exceeds_max_nor_rejects_falsely() -> None:
    rec, setup = run("exact", scenario="skewed", windows=50)
    assert max(rec.admitted) == setup.params.max
    assert rec.false_rejections == 0


def test_local_only_baseline_rejects_the_busy_node_under_the_limit() -> None:
    # 60/30/10 at 0.9 x MAX: the 60% node exhausts its MAX/3 while the fleet is under MAX.
    rec, _ = run("local", scenario="skewed_under", windows=30)
    assert rec.false_rejections > 0.2 * rec.eligible


def test_the_core_blocks_soon_after_the_global_count_crosses_max() -> None:
    rec, setup = run("core", scenario="steady", windows=40)
    lags = sorted(rec.first_reject.values())
    assert lags, "no window crossed MAX"
    # Within about a span (the next sync pushes the total and reads the shared flag).
    assert lags[len(lags) // 2] <= setup.params.span_ms
    assert len(rec.exposed) - len(lags) <= len(rec.exposed) // 20

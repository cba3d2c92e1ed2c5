"""Every algorithm in the simulator: its exact reference, the trailing-window measures, the CLI."""

from __future__ import annotations

import json
from random import Random

import pytest

from ratelimit_sidecar.config.model import AlgorithmName
from ratelimit_sidecar.core import Code, Hit, LocalLimiter
from simulator import SimParams, run_scenario
from simulator.cli import main
from simulator.exact.sliding_window import ExactSlidingWindow
from simulator.metrics import Recorder, summarize, worst_trailing
from simulator.params import build_rule, rule_for
from simulator.references import (
    SlidingWindowReference,
    reference_for,
    trailing_bound,
)
from simulator.scenarios import resolve
from simulator.traffic import Boundary, Bursty, Steady, Surge

SMALL = ["--windows", "6", "--max", "60", "--window", "2s", "--spans", "4"]
# (algorithm, burst): the token bucket also with a burst smaller than requests_per_unit
RULES = [
    (AlgorithmName.FIXED_WINDOW, 0),
    (AlgorithmName.SLIDING_WINDOW, 0),
    (AlgorithmName.TOKEN_BUCKET, 0),
    (AlgorithmName.TOKEN_BUCKET, 3),
    (AlgorithmName.SLIDING_LOG, 0),
]


def test_the_worst_trailing_window_on_hand_built_arrivals() -> None:
    # (t - 10, t] is open on the left: 0 and 10 are never in one window, 5, 10, 14 are.
    assert worst_trailing([0, 10], 10) == 1
    assert worst_trailing([0, 5, 10, 14, 15], 10) == 3
    assert worst_trailing([0, 9, 9, 9, 19, 25], 10) == 4  # same-ms arrivals all count
    assert worst_trailing([3, 40, 41, 48, 49, 50, 51, 60], 10) == 4
    assert worst_trailing([], 10) == 0


def test_summaries_measure_the_system_against_the_reference() -> None:
    rec = Recorder(0, 10, 2, 3, 4)
    rec.bound = 4
    for t, ok, exact in [(0, True, True), (2, True, True), (4, True, False), (6, False, True)]:
        rec.request(t, 0, ok)
        rec.versus(t, ok, exact)
    s = summarize([rec], "hand", "core", has_nodes=False)
    assert (s.trailing_max, s.trailing_exact) == (3, 3)
    assert (s.false_vs_exact, s.exact_admitted, s.exact_rejected) == (1, 3, 1)
    assert s.trailing_over_bound_pct == pytest.approx(-25.0)


@pytest.mark.parametrize(("algorithm", "burst"), RULES)
@pytest.mark.parametrize("cooldown_ms", [0, 700])
def test_each_reference_decides_as_the_core_alone(
    algorithm: AlgorithmName, burst: int, cooldown_ms: int
) -> None:
    """Local-only mode with one node decides exactly: it must agree with the reference on
    every request of a trace that goes over the limit and back under."""
    rule = build_rule(10, 2000, 4, cooldown_ms, algorithm, burst)
    assert rule.limit is not None
    reference, limiter = reference_for(rule.limit), LocalLimiter()
    rng, t = Random(3), 1_700_000_000_000
    decisions: list[tuple[bool, bool]] = []
    for i in range(3000):
        t += int(rng.expovariate(1 / (150 if i % 1000 < 500 else 400)))
        core = limiter.hit(t, [Hit(rule, ("k",), 1)]).code is Code.OK
        decisions.append((core, reference.hit(t)))
    assert [i for i, (core, exact) in enumerate(decisions) if core != exact] == []
    assert 0.5 * len(decisions) < sum(exact for _, exact in decisions) < len(decisions)


def test_the_sliding_window_reference_is_the_exact_module() -> None:
    rule = build_rule(10, 2000, 4, 0, AlgorithmName.SLIDING_WINDOW)
    assert rule.limit is not None
    fast, exact = SlidingWindowReference(rule.limit), ExactSlidingWindow(10, 2000, 4)
    rng, t, refused = Random(5), 10**6, 0
    for _ in range(3000):
        t += int(rng.expovariate(1 / 150))
        assert fast.count(t) == exact.count(t)
        decided = exact.hit(t)
        assert fast.hit(t) == decided
        refused += not decided
    assert refused > 100


def test_local_nodes_share_the_limit_and_the_burst() -> None:
    p = SimParams(max=240, algorithm=AlgorithmName.TOKEN_BUCKET, burst=60)
    limit = rule_for(p, 4).limit
    assert limit is not None and (limit.requests_per_unit, limit.capacity) == (60, 15)
    assert trailing_bound(resolve(p).rule.limit) == 300  # type: ignore[arg-type]
    tiny = rule_for(SimParams(max=3, algorithm=AlgorithmName.TOKEN_BUCKET, burst=2), 4).limit
    assert tiny is not None and (tiny.requests_per_unit, tiny.capacity) == (1, 1)
    window = rule_for(SimParams(algorithm=AlgorithmName.SLIDING_WINDOW, burst=60)).limit
    assert window is not None and (window.burst, window.capacity) == (0, 240)


@pytest.mark.parametrize(
    ("algorithm", "burst"), [(a, 60 if b else 0) for a, b in RULES]
)  # burst: MAX / 4, as docs/ACCURACY.md
def test_each_algorithm_runs_end_to_end(algorithm: AlgorithmName, burst: int) -> None:
    systems = ["local", "exact"] if algorithm is AlgorithmName.SLIDING_LOG else ["core", "exact"]
    under = SimParams(scenario="steady_under", windows=8, algorithm=algorithm, burst=burst)
    for run in run_scenario(under, systems):
        s = run.summary
        assert s.algorithm == algorithm.text
        assert s.exact_rejected == 0  # under the limit the reference admits every request
        assert s.false_vs_exact < 0.02 * s.exact_admitted
        assert s.trailing_max <= s.bound
    over = SimParams(scenario="boundary", windows=8, algorithm=algorithm, burst=burst)
    exact = run_scenario(over, systems)[-1].summary
    assert exact.exact_rejected > 0 and exact.false_vs_exact == 0
    assert exact.trailing_max == exact.trailing_exact
    if algorithm is not AlgorithmName.FIXED_WINDOW:  # the exact fixed window admits 2 x MAX
        assert exact.trailing_exact <= 1.05 * exact.bound


def test_the_boundary_scenario_bursts_across_every_other_window_end() -> None:
    start, window, span = 0, 10_000, 2_000
    schedule = Boundary(0.048, window, span, 0.9, start)
    base, peak = schedule.at(0)[0], schedule.at(window)[0]
    assert schedule.at(0) == (base, window - span // 2)
    assert schedule.at(window - 1_000) == (peak, window + span // 2)
    assert schedule.at(window + 1_000) == (base, 3 * window - span // 2)
    assert schedule.at(3 * window) == (peak, 3 * window + span // 2)
    # two windows carry two windows' worth: 0.048 per ms on average
    assert base * (2 * window - span) + peak * span == pytest.approx(0.048 * 2 * window)


def test_the_cli_runs_each_algorithm(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--scenario", "steady,boundary", "--algorithm", "all", "--burst", "30"]
    assert main([*argv, *SMALL, "--format", "json"]) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)
    seen = {(r["algorithm"], r["system"]) for r in rows}
    assert {algorithm for algorithm, _ in seen} == {a.text for a in AlgorithmName}
    assert ("sliding_log", "core") not in seen and ("sliding_log", "local") in seen
    assert "a fleet runs it as sliding_window" in out.err
    assert all(r["bound"] == 90 for r in rows if r["algorithm"] == "token_bucket")
    assert main(["--scenario", "steady", "--algorithm", "sliding_window", *SMALL]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["scenario", "system", "algorithm", "win", "offered/w"]
    assert {line.split()[2] for line in lines[2:]} == {"sliding_window"}


def test_the_cli_refuses_what_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--algorithm", "leaky_bucket"])
    assert main(["--algorithm", "sliding_log", "--systems", "core", *SMALL]) == 2
    assert "sliding_log runs only as local and exact" in capsys.readouterr().err


def test_sub_second_windows_derive_cooldown_and_capacity_per_algorithm() -> None:
    bucket = build_rule(10, 1_500, 3, 0, AlgorithmName.TOKEN_BUCKET, 4).limit
    sliding = build_rule(10, 1_500, 3, 0, AlgorithmName.SLIDING_WINDOW).limit
    assert bucket is not None and (bucket.window_ms, bucket.cooldown, bucket.capacity) == (
        1_500,
        0,
        4,
    )
    assert sliding is not None and (sliding.cooldown, sliding.capacity) == (0, 10)


def test_the_bursty_scenario_sends_bursts() -> None:
    """Its schedule packs half of each window into one burst: not the steady scenario's rate."""
    bursty = resolve(SimParams(scenario="bursty", load=2.0)).schedule(Random(1))
    steady = resolve(SimParams(scenario="steady", load=2.0)).schedule(Random(1))
    assert isinstance(bursty, Bursty) and isinstance(steady, Steady)


def test_the_surge_scenario_is_quiet_until_a_window_start_at_mid_run() -> None:
    """0.3 of MAX a window until the half of the run, then the load, from a window's start."""
    setup = resolve(SimParams(scenario="surge", load=2.0, windows=12))
    surge = setup.schedule(Random(1))
    at = setup.start_ms + 6 * setup.params.window_ms
    per_window = setup.params.max / setup.params.window_ms
    assert isinstance(surge, Surge)
    quiet, until = surge.at(at - 1)
    assert quiet == pytest.approx(0.3 * per_window) and until == at
    assert surge.at(at)[0] == pytest.approx(2.0 * per_window)

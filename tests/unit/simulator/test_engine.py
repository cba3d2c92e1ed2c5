"""The event loop drives the core as the sync loop does; results depend only on the seed."""

from __future__ import annotations

import dataclasses

from ratelimit_sidecar.core import SyncBatch, TotalRead
from simulator import SimParams, run_scenario
from simulator.engine import KEY
from simulator.variants import SYSTEMS, system_for
from tests.unit.simulator.helpers import engine


def test_same_seed_same_results_other_seed_other_results() -> None:
    params = SimParams(scenario="skewed", windows=20, seed=7)
    first, again = run_scenario(params, ["core", "local"]), run_scenario(params, ["core", "local"])
    for a, b in zip(first, again, strict=True):
        assert dataclasses.replace(a.summary, cpu_s=0) == dataclasses.replace(b.summary, cpu_s=0)
        assert a.recorder.admitted_span == b.recorder.admitted_span
    other = run_scenario(dataclasses.replace(params, seed=8), ["core"])[0]
    assert other.recorder.offered != first[0].recorder.offered


def test_every_system_is_offered_the_same_requests() -> None:
    runs = run_scenario(SimParams(scenario="steady", windows=10), ["core", "local", "exact"])
    assert len({tuple(r.recorder.offered_span) for r in runs}) == 1


def test_combined_variants_change_every_parameter_either_one_changes() -> None:
    assert system_for("hard+admitted").algorithm == SYSTEMS["old"].algorithm
    combined = system_for("admitted+redis-time")
    assert combined.store_clock and not combined.algorithm.nodes_from_offered


def test_a_store_slower_than_the_timeout_counts_hits_the_nodes_never_hear_of() -> None:
    # 300 ms > the 250 ms timeout: the store applies every INCRBY (it got the request) while
    # each node falls back, as a real timed-out Redis call does.
    eng, setup = engine("core", scenario="steady", windows=6, latency_ms=300)
    failures = 0
    apply = eng._apply

    def spy(node):
        nonlocal failures
        failures += node.answer is None and bool(node.batch and node.batch.pushes)
        apply(node)

    eng._apply = spy  # type: ignore[method-assign]
    rec = eng.run()
    assert failures > 0
    window = (setup.end_ms - 1) // setup.params.window_ms - 1
    read = SyncBatch(setup.end_ms, total_reads=[TotalRead(KEY, window)])
    assert eng.shared.store.execute(read).totals[0] >= rec.admitted[-2] * 0.8


def test_latency_delays_the_answer_and_requests_in_between_see_the_old_state() -> None:
    eng, _ = engine("core", scenario="steady", windows=4, latency_ms=200)
    timeline: list[tuple[int, str]] = []
    sync, apply = eng._sync, eng._apply

    def on_sync(node):
        timeline.append((eng.now, "send"))
        sync(node)

    def on_apply(node):
        timeline.append((eng.now, "apply"))
        assert node.limiter._plan is not None  # still in flight until now
        apply(node)

    eng._sync, eng._apply = on_sync, on_apply  # type: ignore[method-assign]
    eng.run()
    sends = [t for t, kind in timeline if kind == "send"]
    applies = [t for t, kind in timeline if kind == "apply"]
    assert applies and all(a - s == 200 for s, a in zip(sends, applies, strict=False))


def test_clock_skew_spreads_node_clocks_and_redis_time_removes_it() -> None:
    skewed, setup = engine("core", scenario="skew", windows=2, skew_ms=500)
    skewed.run()
    assert sorted(n.offset for n in skewed.nodes.values()) == [-500, -167, 167, 500]
    store_clock, _ = engine("redis-time", scenario="skew", windows=2, skew_ms=500)
    store_clock.run()
    assert {n.offset for n in store_clock.nodes.values()} == {0}
    assert setup.slack_ms == setup.params.span_ms + 1000


def test_churn_starts_and_stops_nodes_and_flushes_the_leavers() -> None:
    eng, setup = engine("core", scenario="churn", windows=12)
    rec = eng.run()
    assert sorted(eng.nodes) == [2, 3, 4, 5]  # nodes 0 and 1 left, 4 and 5 joined
    assert rec.dropped_hits == 0  # the leavers pushed everything before going
    assert len(setup.membership.weights) == 6

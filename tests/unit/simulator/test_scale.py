"""The scale model's pure parts: key populations, interpolation, chunking, shards, and the
per-key simulation of the real core on its virtual clock."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.scale import (
    SHARD_BUDGET,
    Case,
    active_keys,
    class_rates,
    heartbeats_per_s,
    interpolated,
    per_request_load,
    population,
    script_calls,
    shards,
    summary,
    zipf_bins,
)
from simulator.scale_keys import KeyCost, KeyLoad, KeySim, sample_size


def test_zipf_bins_cover_the_population_with_its_exact_head() -> None:
    bins = zipf_bins(5000, 1.0)
    assert sum(b.keys for b in bins) == 5000
    assert math.isclose(sum(b.keys * b.share for b in bins), 1.0)
    exact = sum(r**-1.0 for r in range(1, 5001))
    assert math.isclose(bins[0].share, 1 / exact, rel_tol=1e-3)
    assert bins[0].share > bins[1].share > bins[-1].share


def test_population_makes_each_gateway_see_the_keys_asked_for() -> None:
    case = Case(10, keys_per_gateway=2000, rate_per_gateway=100.0)
    seen = active_keys(zipf_bins(population(case), case.zipf), case)
    assert seen == pytest.approx(2000, rel=0.01)
    with pytest.raises(ValueError, match="more active keys"):
        population(Case(10, keys_per_gateway=6000, rate_per_gateway=100.0))


def test_class_rates_span_the_rates_of_the_bins() -> None:
    rates = class_rates(0.003, 40.0)
    assert rates[0] <= 0.003 and rates[-1] >= 40.0
    assert all(b / a == pytest.approx(10**0.25) for a, b in itertools.pairwise(rates))


def test_interpolation_is_linear_between_classes_and_proportional_below() -> None:
    grid = [(1.0, KeyCost(gets=10.0, offered=60.0)), (3.0, KeyCost(gets=20.0, offered=180.0))]
    assert interpolated(2.0, grid).gets == pytest.approx(15.0)
    assert interpolated(0.5, grid).gets == pytest.approx(5.0)
    assert interpolated(9.0, grid).offered == pytest.approx(180.0)


def test_script_calls_chunk_each_gateways_span() -> None:
    case = Case(10, spans=6)  # a span end every 10 s
    assert script_calls(case, 1.0) == 1.0  # under one entry a span: one call each
    assert script_calls(case, 10 * 0.1 * 999) == pytest.approx(10 * 0.1)
    assert script_calls(case, 10 * 0.1 * 2500) == pytest.approx(10 * 0.1 * 3)


def test_shards_carry_their_budget() -> None:
    assert shards(0.0) == 1
    assert shards(SHARD_BUDGET) == 1
    assert shards(SHARD_BUDGET * 1.01) == 2
    assert shards(10 * SHARD_BUDGET) == 10


def test_per_request_design_prices_two_commands_a_request() -> None:
    costs = {"request": {"cpu_us": 10.0, "commands": 2.0, "client_commands": 2.0}}
    costs["request"] |= {"bytes_in": 90.0, "bytes_out": 10.0}
    result = summary(per_request_load(Case(100, rate_per_gateway=1000.0)), costs)
    assert result["commands_per_s"] == 200_000
    assert result["redis_cores"] == pytest.approx(1.0)
    assert result["shards"] == math.ceil(1.0 / SHARD_BUDGET)
    assert result["bytes_per_s"] == pytest.approx(1e7)
    assert result["over_admitted_per_s"] == 0


def test_sample_stands_for_a_whole_number_of_gateways() -> None:
    assert sample_size(3) == 3
    assert sample_size(100) == 10
    assert sample_size(1000) == 10
    assert sample_size(13) == 1


def test_a_quiet_key_is_counted_in_full_and_never_over_admitted() -> None:
    load = KeyLoad(gateways=3, per_gateway_rps=0.05)  # 9 requests a window fleet-wide
    sim = KeySim(load, seed=7)
    cost = sim.run()
    assert cost.offered == pytest.approx(9, rel=0.3)
    assert cost.admitted == cost.offered
    assert cost.over_admitted == 0
    pushed = cost.entries["under"] + cost.entries["over"]
    assert 0 < pushed <= cost.offered * 2  # a push carries one span's hits of one gateway


def test_a_hot_key_is_held_near_its_limit_and_pushed_over_it() -> None:
    load = KeyLoad(gateways=3, per_gateway_rps=5.0)  # 900 requests a window against 100
    cost = KeySim(load, seed=7).run()
    assert cost.offered == pytest.approx(900, rel=0.1)
    assert cost.admitted <= load.limit * 1.5
    assert cost.entries["over"] > 0


def test_a_sample_scales_up_to_the_fleet() -> None:
    small = KeySim(KeyLoad(gateways=1000, per_gateway_rps=0.0002), seed=3)
    assert (small.sample, small.scale) == (10, 100)
    cost = small.run()
    assert cost.offered == pytest.approx(1000 * 0.0002 * 60, rel=0.3)


def test_a_gateway_beats_once_per_span_between_one_and_ten_seconds() -> None:
    assert heartbeats_per_s(Case(10, spans=6)) == pytest.approx(0.1, rel=0.05)
    assert heartbeats_per_s(Case(10, spans=12)) == pytest.approx(0.2, rel=0.05)
    assert heartbeats_per_s(Case(10, window_ms=1000, spans=4)) == pytest.approx(1.0, rel=0.05)
    assert heartbeats_per_s(Case(10, window_ms=600_000, spans=6)) == pytest.approx(0.1, rel=0.05)


def test_the_scale_command_prints_both_designs_and_saves_its_calibration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kinds = ("request", "incrby", "expire", "entry_under", "entry_over", "entry_read", "get")
    figures = {"cpu_us": 5.0, "commands": 2.0, "client_commands": 1.0}
    figures |= {"bytes_in": 50.0, "bytes_out": 5.0}
    costs = dict.fromkeys((*kinds, "script_call", "heartbeat"), figures)
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"calibration": {**costs, "redis": {"version": "test"}}}))
    results = tmp_path / "scale.json"
    argv = ["scale", "--gateways", "2,4", "--keys", "20", "--rate", "5", "--window-s", "10"]
    argv += ["--spans", "2", "--calibration", str(calibration), "--results", str(results)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "per-request" in out and "sidecar" in out and "entry_read" in out
    saved = json.loads(results.read_text())
    assert saved["calibration"]["request"] == figures
    assert [r["case"]["gateways"] for r in saved["results"]] == [2, 4]
    # The per-request design: two commands (as priced here) for every request of the fleet.
    per_request = saved["results"][1]["per-request"]
    assert per_request["commands_per_s"] == pytest.approx(2 * 4 * 5.0)

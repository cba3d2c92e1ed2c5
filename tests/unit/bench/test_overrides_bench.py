"""The overrides bench's arithmetic and table: percentiles, rows, the verdict, its state file."""

from __future__ import annotations

import json
from pathlib import Path

from bench.overrides import (
    Propagation,
    ms,
    propagation_met,
    propagation_rows,
    propagation_table,
    write_state,
)
from ratelimit_sidecar.overrides.file_store import FILE_NAME


def result(missed: int = 0, slow: float = 0.2) -> Propagation:
    lags = {"n1": [0.01 * i for i in range(1, 101)], "n2": [0.005] * 99 + [slow]}
    histogram = {"n1": (100.0, 2.0), "n2": (100.0, 1.0)}
    return Propagation(lags, missed, [0.004, 0.006, 0.005], histogram)


def test_percentiles_are_nearest_rank_in_ms() -> None:
    values = [i / 1000 for i in range(100, 0, -1)]
    assert [ms(values, q) for q in (50, 99, 100)] == ["50.0", "99.0", "100.0"]
    assert ms([0.003], 99) == "3.0"
    assert ms([], 50) == "-"


def test_rows_per_node_and_for_all() -> None:
    rows = propagation_rows(result())
    assert [row[0] for row in rows] == ["n1", "n2", "all"]
    assert rows[0] == ["n1", "100", "500.0", "990.0", "1,000.0", "20.0"]
    assert rows[1] == ["n2", "100", "5.0", "5.0", "200.0", "10.0"]
    assert rows[2][:2] == ["all", "200"]
    assert rows[2][-1] == "15.0"  # the histograms pooled: 3 s over 200 observations


def test_the_target_is_p99_under_a_second_and_nothing_missed() -> None:
    assert propagation_met(result())
    assert not propagation_met(result(missed=1))
    many_slow = Propagation({"n1": [1.5] * 10 + [0.01] * 90}, 0, [0.005], {})
    assert not propagation_met(many_slow)
    text = "\n".join(propagation_table(result()))
    assert "PASS" in text and "missed (not applied within 5 s): 0" in text
    assert "histogram mean ms" in text


def test_the_state_file_holds_one_override_per_value(tmp_path: Path) -> None:
    write_state(tmp_path, ["c0", "c1"])
    state = json.loads((tmp_path / FILE_NAME).read_text())
    assert (state["version"], len(state["documents"])) == (1, 2)
    values = sorted(d["descriptor"][0]["value"] for d in state["documents"].values())
    assert values == ["c0", "c1"]
    assert all(i == d["id"] for i, d in state["documents"].items())

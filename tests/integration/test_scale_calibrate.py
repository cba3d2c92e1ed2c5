"""The scale model's calibration against a real Redis: each kind of work is counted as Redis
counts it, the commands inside the sync scripts included."""

from __future__ import annotations

import pytest

from simulator import scale_calibrate

pytestmark = [pytest.mark.integration]


def test_calibration_counts_each_kind_of_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scale_calibrate, "ROUND_TRIPS", 200)
    monkeypatch.setattr(scale_calibrate, "IDLE_S", 0.5)
    costs = scale_calibrate.calibrate()
    request = costs["request"]
    assert (request["commands"], request["client_commands"]) == (2.0, 2)
    assert request["bytes_in"] > 0 and request["cpu_us"] > 0
    # An entry is a few commands run by the script (INCRBY, PEXPIRE at least), none sent.
    for kind in ("entry_under", "entry_over", "entry_read"):
        assert costs[kind]["commands"] >= 2
        assert costs[kind]["client_commands"] < 0.01
        assert costs[kind]["bytes_in"] > 10
    assert costs["get"]["commands"] == pytest.approx(1.0, abs=0.01)
    # One heartbeat command, and the commands its script runs.
    assert costs["heartbeat"]["client_commands"] == 1
    assert costs["heartbeat"]["commands"] > 1
    assert costs["script_call"]["client_commands"] == pytest.approx(1.0, abs=0.01)
    assert costs["redis"]["version"]

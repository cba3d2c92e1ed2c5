"""`bench redis-sync`'s scenario code on a small scale: three sidecars and a replay of the
reference against one real Redis, counted the way the benchmark counts them."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import sync_scenarios
from harness.redis_servers import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_hot_keys_are_counted_on_both_sides(
    tmp_path: Path, own_redis_server: ServerProcess
) -> None:
    scenario = sync_scenarios.hot(users=2, each=150, window_s=2, spans=2)
    result = sync_scenarios.measure(tmp_path, own_redis_server, scenario, idle_min_s=1.0)
    ours, reference = result["ours"], result["reference"]
    assert result["requests"] == 300
    assert sync_scenarios.LIMIT <= result["admitted"] <= 300
    # The replay sends exactly two commands per request, and no script runs inside Redis.
    assert reference["client_commands"] == reference["all_commands"] == 600
    assert reference["by_command"] == {"expire": 300, "incrby": 300}
    # The sidecars' sync scripts count the hits with INCRBY inside Redis: Redis runs more
    # commands than the sidecars sent.
    assert 0 < ours["client_commands"] < ours["all_commands"]
    assert ours["by_command"]["incrby"] >= 2
    assert reference["cpu_ms"] > 0 and ours["cpu_ms"] > 0


def test_report_judges_each_scenario_against_its_target() -> None:
    def side(commands: int, cpu_ms: float) -> dict[str, float]:
        counts = {"client_commands": commands, "all_commands": commands}
        return {**counts, "net_cpu_ms": cpu_ms, "cpu_ms": cpu_ms + 50}

    def result(name: str, ours: dict[str, float]) -> dict[str, object]:
        return {
            "scenario": name,
            "requests": 100,
            "ours": ours,
            "reference": side(200, 100.0),
            "redis_idle_cpu_ms_per_s": 0.5,
            "idle_commands_per_s": 3.0,
            "idle_client_commands_per_s": 3.0,
        }

    _, met = sync_scenarios.report(
        [result("long tail", side(20, 20.0)), result("hot", side(5, 9.0))]
    )
    assert met
    _, met = sync_scenarios.report(
        [result("long tail", side(30, 20.0)), result("hot", side(5, 9.0))]
    )
    assert not met  # 0.30 commands per request
    _, met = sync_scenarios.report(
        [result("long tail", side(20, 20.0)), result("hot", side(5, 11.0))]
    )
    assert not met  # 0.11x the reference's CPU

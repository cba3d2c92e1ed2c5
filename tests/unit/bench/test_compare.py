"""bench/compare.py: the ratio that decides, its basis and spread, verdicts and the table."""

from __future__ import annotations

from dataclasses import replace

from bench import compare
from bench.load.clients import Latency
from bench.load.cpu import CpuWindow
from bench.load.runs import Run


def run(
    server: str,
    round_no: int,
    requests: int,
    *,
    cpu_pct: float = 100.0,
    p99_ms: float = 10.0,
    other_pct: float = 0.0,
    errors: int = 0,
) -> Run:
    """One 1-second run of hot-10 with h2load."""
    return Run(
        workload="hot-10",
        client="h2load",
        server=server,
        round_no=round_no,
        requests=requests,
        duration_s=1.0,
        errors=errors,
        first_error="boom" if errors else "",
        latencies_ms=[p99_ms],
        latency=Latency(p99_ms, p99_ms, p99_ms),
        cpu=CpuWindow(1.0, {"server": cpu_pct}, 50.0, other_pct, 0.0),
        counters={},
    )


def two_rounds(**ours: float) -> list[Run]:
    """The baseline at 1,000 RPS in both rounds; `server` at 900 then 1,000."""
    return [
        run("empty", 0, 1_000),
        run("server", 0, 900, **ours),  # type: ignore[arg-type]
        run("server", 1, 1_000, **ours),  # type: ignore[arg-type]
        run("empty", 1, 1_000),
    ]


def test_saturated_servers_compare_by_rps_with_the_rounds_spread() -> None:
    found = compare.compare(two_rounds(), "server", "empty", "hot-10", "h2load", by_cpu=True)
    assert found.basis == "RPS"
    assert found.per_round == (0.9, 1.0)
    assert found.ratio == 0.95
    assert found.spread == "90.0% .. 100.0%"
    assert found.passed is None  # no target: shown, not judged
    assert found.verdict == "-"
    assert replace(found, target=0.9).passed is True
    assert replace(found, target=0.96).passed is False


def test_an_idle_server_is_compared_per_cpu_second_when_asked() -> None:
    measured = two_rounds(cpu_pct=50.0)  # half a core: twice the RPS per CPU-second
    by_cpu = compare.compare(measured, "server", "empty", "hot-10", "h2load", by_cpu=True)
    assert by_cpu.basis == "RPS per CPU-s"
    assert by_cpu.per_round == (1.8, 2.0)
    by_rps = compare.compare(measured, "server", "empty", "hot-10", "h2load")
    assert by_rps.basis == "RPS"
    assert by_rps.ratio == 0.95


def test_p99_no_worse_fails_a_slower_tail_even_with_enough_rps() -> None:
    found = compare.compare(two_rounds(p99_ms=20.0), "server", "empty", "hot-10", "h2load")
    assert found.p99_ratio == 2.0
    assert replace(found, target=0.9).passed is True
    slower = replace(found, target=0.9, p99_no_worse=True)
    assert slower.passed is False
    assert slower.verdict == "FAIL"


def test_errors_other_load_and_missing_servers_are_not_judged() -> None:
    def judged(measured: list[Run], server: str = "server") -> compare.Comparison:
        return compare.compare(measured, server, "empty", "hot-10", "h2load", target=0.5)

    failed = judged(two_rounds(errors=3))
    assert failed.passed is None
    assert failed.verdict.startswith("INVALID")
    noisy = judged(two_rounds(other_pct=30.0))
    assert noisy.passed is None
    assert noisy.verdict.startswith("INCONCLUSIVE")
    missing = judged(two_rounds(), "other")
    assert missing.ratio is None
    assert missing.spread == "-"
    assert missing.verdict == "NOT MEASURED"


def test_only_the_named_workload_and_client_count() -> None:
    elsewhere = [replace(run("server", 2, 100), workload="other"), run("empty", 2, 1_000)]
    elsewhere.append(replace(run("server", 3, 100), client="node-http2"))
    found = compare.compare([*two_rounds(), *elsewhere], "server", "empty", "hot-10", "h2load")
    assert found.per_round == (0.9, 1.0)


def test_against_compares_each_server_in_every_workload_and_client_measured() -> None:
    elsewhere = [replace(r, client="node-http2") for r in two_rounds()]
    found = compare.against([*two_rounds(), *elsewhere], "empty", ["server"], target=0.9)
    assert [(c.client, c.server, c.baseline, c.target) for c in found] == [
        ("h2load", "server", "empty", 0.9),
        ("node-http2", "server", "empty", 0.9),
    ]
    assert compare.verdicts(found) == [True, True]


def test_the_table_has_one_line_per_comparison_and_the_json_no_rows() -> None:
    found = compare.compare(two_rounds(), "server", "empty", "hot-10", "h2load", target=0.9)
    lines = compare.comparison_table([found, replace(found, target=None)]).splitlines()
    assert len(lines) == 4 + compare.LEGEND.count("\n") + 1
    assert "95.0%" in lines[2]
    assert lines[2].rstrip().endswith("PASS")
    assert lines[3].rstrip().endswith("-")
    document = compare.as_json(found)
    assert "server_row" not in document
    assert (document["ratio"], document["passed"]) == (0.95, True)

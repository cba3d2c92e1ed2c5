"""`ratelimit-sidecar simulate` end to end, on small runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.params import build_rule, parse_duration_ms
from simulator.scenarios import SCENARIOS

SMALL = ["--windows", "12", "--max", "60", "--window", "2s", "--spans", "4"]


def test_prints_one_table_row_per_system(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--scenario", "steady", *SMALL]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["scenario", "system", "win", "offered/w"]
    assert [line.split()[1] for line in lines[2:]] == ["core", "local", "exact"]
    assert all(line.split()[2] == "12" for line in lines[2:])


def test_json_markdown_and_a_leading_double_dash(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--", "--scenario", "outage", "--outage", "6:12", "--systems", "core,hard+redis-time"]
    assert main([*argv, *SMALL, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["system"] for r in rows] == ["core", "hard+redis-time"]
    assert rows[0]["windows"] == 12 and rows[0]["max"] == 60
    assert main(["--scenario", "bursty", *SMALL, "--format", "markdown"]) == 0
    assert capsys.readouterr().out.startswith("| scenario | system |")


def test_all_scenarios_and_the_listing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    assert "skewed_under" in capsys.readouterr().out
    assert main(["--scenario", "all", *SMALL, "--systems", "core", "--repeat", "2"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert len(rows) == len(SCENARIOS) and all(r.split()[2] == "24" for r in rows)  # 2 seeds


def test_bad_input_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--scenario", "nope"]) == 2
    assert "unknown scenario 'nope'" in capsys.readouterr().err
    assert main(["--systems", "core,typo"]) == 2
    assert "unknown system 'typo'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--outage", "10"])


def test_plot_writes_a_small_png(tmp_path: Path) -> None:
    target = tmp_path / "sim.png"
    assert main(["--scenario", "outage", *SMALL, "--outage", "8:14", "--plot", str(target)]) == 0
    data = target.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (900, 400)


def test_plot_without_matplotlib_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    assert main(["--scenario", "steady", *SMALL, "--plot", str(tmp_path / "x.png")]) == 2
    assert "pip install 'ratelimit-sidecar[plot]'" in capsys.readouterr().err


def test_durations_and_sub_second_windows() -> None:
    assert [parse_duration_ms(t) for t in ("10", "10s", "1.5s", "500ms", "2m")] == [
        10_000,
        10_000,
        1_500,
        500,
        120_000,
    ]
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_ms("ten")
    limit = build_rule(10, 1_500, 3, 0).limit
    assert limit is not None
    assert (limit.window_ms, limit.cooldown) == (1_500, 1_500)
    assert main(["--scenario", "steady", "--window", "1500ms", "--windows", "20"]) == 0


def test_the_simulator_imports_no_grpc_redis_or_asyncio() -> None:
    code = (
        "import sys\n"
        "from simulator.cli import main\n"
        "main(['--scenario', 'latency', '--windows', '3', '--format', 'json'])\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('grpc', 'redis', 'asyncio')]\n"
        "sys.exit(f'imported {bad}' if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_subcommand_finds_the_simulator_of_its_checkout_from_anywhere(tmp_path: Path) -> None:
    """`ratelimit-sidecar simulate` in another directory: the package never imports the
    simulator, the subcommand looks for it beside the package."""
    code = "import sys; from ratelimit_sidecar.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "simulate", "--list"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "scenarios:" in done.stdout

from __future__ import annotations

from pathlib import Path

import pytest

from ratelimit_sidecar.cli_check import run_check
from ratelimit_sidecar.config import load_rules

FIXTURES = Path(__file__).parent / "fixtures"


def test_valid_file_prints_one_summary_line(capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURES / "spec_example.yaml"

    assert run_check(str(path)) == 0

    out, err = capsys.readouterr()
    assert out == f"OK: 1 domain, 4 rules (version {load_rules(path).version})\n"
    assert err == ""


def test_valid_directory_counts_every_domain(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_check(str(FIXTURES / "multi")) == 0

    out, _ = capsys.readouterr()
    assert out.startswith("OK: 2 domains, 3 rules (version ")


def test_invalid_file_prints_each_problem_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURES / "errors" / "unlimited_with_unit.yaml"

    assert run_check(str(path)) == 1

    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{path}:7: descriptors[0].rate_limit.unit: must not be set when unlimited is true",
        f"{path}:8: descriptors[0].rate_limit.requests_per_unit: must not be set when unlimited"
        " is true",
    ]


def test_missing_path_fails(capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURES / "missing"

    assert run_check(str(path)) == 1

    assert capsys.readouterr().err == f"{path}:0: file: no such file or directory\n"

from __future__ import annotations

from pathlib import Path

import pytest

from harness.hostile_rules import alias_bomb, alias_cycle, many_descriptors, sparse_file
from ratelimit_sidecar.cli import main
from ratelimit_sidecar.cli.check import run_check
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


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("bomb.yaml", alias_bomb(), ":8: yaml: with aliases expanded, the file has more than"),
        ("cycle.yaml", alias_cycle(), ":4: yaml: alias *all is inside the node it refers to"),
        ("huge.yaml", None, f":0: file: {50 * 1024 * 1024} bytes is more than the limit of"),
    ],
)
def test_hostile_files_fail_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str | None, expected: str
) -> None:
    path = tmp_path / name
    if text is None:
        sparse_file(path, 50 * 1024 * 1024)
    else:
        path.write_text(text)

    assert run_check(str(path)) == 1

    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith(f"{path}{expected}")


def test_check_takes_the_limit_flags_and_variables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "many.yaml"
    path.write_text(many_descriptors(3))

    assert main(["check", str(path)]) == 0
    assert main(["check", "--max-yaml-nodes", "20", str(path)]) == 1
    monkeypatch.setenv("RLS_MAX_RULE_DESCRIPTORS", "2")
    assert main(["check", str(path)]) == 1

    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"{path}:7: yaml: the file has more than 20 YAML nodes"
        " (raise the limit with --max-yaml-nodes / RLS_MAX_YAML_NODES)",
        f"{path}:9: descriptors[2]: more than 2 descriptors in the rule set"
        " (raise the limit with --max-rule-descriptors / RLS_MAX_RULE_DESCRIPTORS)",
    ]

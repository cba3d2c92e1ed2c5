from __future__ import annotations

import pytest

from ratelimit_sidecar.config import ConfigError, Problem


def test_problem_renders_file_line_key_message() -> None:
    problem = Problem("rules/shop.yaml", 7, "descriptors[0].rate_limit.unit", "invalid unit 'x'")

    assert str(problem) == "rules/shop.yaml:7: descriptors[0].rate_limit.unit: invalid unit 'x'"


def test_problem_is_frozen() -> None:
    problem = Problem("a.yaml", 1, "domain", "required key is missing")

    with pytest.raises(AttributeError):
        problem.line = 2  # type: ignore[misc]


def test_config_error_joins_problems_one_per_line() -> None:
    problems = [Problem("a.yaml", 1, "domain", "one"), Problem("b.yaml", 3, "descriptors", "two")]

    error = ConfigError(problems)

    assert error.problems == problems
    assert str(error) == "a.yaml:1: domain: one\nb.yaml:3: descriptors: two"
    assert isinstance(error, Exception)

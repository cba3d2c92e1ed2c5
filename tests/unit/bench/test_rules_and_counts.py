"""The bench rules each section serves are valid for what they test, and the strict section's
reading of the sidecar's strict check counters."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from bench import algorithms, strict
from bench.load import runs
from bench.load.clients import Latency
from bench.load.cpu import CpuWindow
from bench.load.runs import Run
from bench.load.servers import samples
from bench.workload import RULES_YAML, rules_dir, rules_yaml
from ratelimit_sidecar.config.errors import ConfigError
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.config.matcher import match
from ratelimit_sidecar.config.model import AlgorithmName, RuleDefaults, RuleSet, StoreFailure


def loaded(text: str, algorithm: AlgorithmName, shared_store: bool = False) -> RuleSet:
    with tempfile.TemporaryDirectory() as tmp:
        defaults = RuleDefaults(algorithm=algorithm, shared_store=shared_store)
        return load_rules(rules_dir(Path(tmp), text), defaults=defaults)


def test_the_default_bench_rule_is_unchanged() -> None:
    assert RULES_YAML == (
        "domain: bench\ndescriptors:\n  - key: client\n"
        "    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"
    )


@pytest.mark.parametrize("algorithm", list(AlgorithmName))
def test_each_algorithms_rule_is_valid_for_it_and_runs_it(algorithm: AlgorithmName) -> None:
    rules = loaded(rules_yaml(algorithms.unreachable_limit(algorithm)), algorithm)
    domain = rules.domain("bench")
    assert domain is not None
    rule = match(domain, [("client", "c1")])
    assert rule is not None
    limit = rule.limit
    assert limit is not None
    assert limit.algorithm is algorithm
    assert not limit.strict


@pytest.mark.parametrize("algorithm", list(AlgorithmName))
def test_each_strict_rule_is_strict_and_runs_its_algorithm(algorithm: AlgorithmName) -> None:
    rules = loaded(strict.strict_rule(algorithm), AlgorithmName.FIXED_WINDOW, shared_store=True)
    domain = rules.domain("bench")
    assert domain is not None
    rule = match(domain, [("client", "c1")])
    assert rule is not None
    limit = rule.limit
    assert limit is not None
    assert limit.algorithm is algorithm
    assert limit.strict
    assert limit.on_store_failure is StoreFailure.DENY


def test_a_sliding_log_refuses_the_default_limit() -> None:
    with pytest.raises(ConfigError):
        loaded(rules_yaml(), AlgorithmName.SLIDING_LOG)


def test_strict_counts_reads_each_result() -> None:
    lines = [
        "# HELP ratelimit_sidecar_strict_checks_total Requests' strict checks by result",
        'ratelimit_sidecar_strict_checks_total{result="admitted"} 1234.0',
        'ratelimit_sidecar_strict_checks_total{result="failed"} 2.0',
        'ratelimit_sidecar_strict_checks_created{result="failed"} 1.7e9',
        'ratelimit_sidecar_total_hits_total{domain="bench"} 99.0',
    ]
    found = strict.strict_counts(samples(lines, strict.STRICT_METRIC))
    assert found == {"admitted": 1234, "failed": 2}


def test_failed_strict_checks_count_as_failed_requests() -> None:
    found = Run(
        "hot-10",
        "h2load",
        "strict fixed_window",
        0,
        100,
        1.0,
        0,
        "",
        [],
        Latency(1.0, 1.0, 1.0),
        CpuWindow(1.0, {"server": 100.0}, 10.0, 0.0, 0.0),
        {"admitted": 90, "failed": 4, "breaker_open": 6},
    )
    clean = replace(found, counters={"admitted": 100})
    marked = runs.with_failures([found, clean], strict.undecided)
    assert marked[0].errors == 10
    assert "10 strict checks" in marked[0].first_error
    assert marked[1].errors == 0


def test_script_counts_and_the_cells_of_a_row() -> None:
    stats = {"cmdstat_evalsha": {"calls": 40, "usec": 100, "usec_per_call": 2.5}}
    counts = strict.script_counts(stats)
    assert strict.script_counts({}) == {strict.SCRIPT_CALLS: 0, strict.SCRIPT_USEC: 0}
    found = Run(
        "hot-10",
        "h2load",
        "strict fixed_window",
        0,
        40,
        1.0,
        0,
        "",
        [],
        Latency(1.0, 1.0, 1.0),
        CpuWindow(1.0, {"server": 100.0}, 10.0, 0.0, 0.0),
        {**counts, "admitted": 40, "failed": 0},
    )
    assert strict.script_us(found) == 2.5
    assert strict.checks_cell(found) == "admitted 40"
    assert strict.script_us(replace(found, counters={})) is None

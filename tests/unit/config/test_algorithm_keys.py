"""The per-rule algorithm keys: what loads, and every refusal naming file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.config import ConfigError, load_rules
from ratelimit_sidecar.config.matcher import match
from ratelimit_sidecar.config.model import (
    AlgorithmName,
    Consistency,
    RateLimit,
    RuleDefaults,
    StoreFailure,
    Unit,
)

GOOD = """\
domain: d
descriptors:
  - key: api_key
    rate_limits:
      - {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 40}
      - {unit: day, requests_per_unit: 100000}
  - key: search
    rate_limit: {unit: minute, requests_per_unit: 600, algorithm: sliding_window}
  - key: login
    rate_limit:
      unit: minute
      requests_per_unit: 5
      algorithm: sliding_log
      consistency: strict
      on_store_failure: deny
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return path


def test_the_keys_load_into_each_limit(tmp_path: Path) -> None:
    domain = load_rules(write(tmp_path, GOOD)).domain("d")
    assert domain is not None
    several = match(domain, [("api_key", "x")])
    assert several is not None and len(several.limits) == 2
    bucket, day = several.limits
    assert several.limit is bucket
    assert (bucket.algorithm, bucket.burst, bucket.capacity) == (
        AlgorithmName.TOKEN_BUCKET,
        40,
        40,
    )
    assert (day.algorithm, day.unit, day.capacity) == (AlgorithmName.FIXED_WINDOW, Unit.DAY, 100000)
    login = match(domain, [("login", "u")])
    assert login is not None and login.limit is not None
    assert login.limit.strict and login.limit.on_store_failure is StoreFailure.DENY
    assert login.limit.cooldown == 0  # only a fixed window blocks by default
    plain = match(domain, [("plain", "p")])
    assert plain is not None and plain.limit is not None
    assert plain.limit.cooldown == plain.limit.window_ms and not plain.limit.strict


def test_the_default_algorithm_applies_to_rules_that_name_none(tmp_path: Path) -> None:
    defaults = RuleDefaults(algorithm=AlgorithmName.SLIDING_WINDOW)
    domain = load_rules(write(tmp_path, GOOD), defaults=defaults).domain("d")
    assert domain is not None
    plain = match(domain, [("plain", "p")])
    assert plain is not None and plain.limit is not None
    assert plain.limit.algorithm is AlgorithmName.SLIDING_WINDOW
    login = match(domain, [("login", "u")])
    assert login is not None and login.limit is not None
    assert login.limit.algorithm is AlgorithmName.SLIDING_LOG  # named: kept


BAD = [
    (
        "rate_limit: {unit: second, requests_per_unit: 5, algorithm: leaky}",
        "5: descriptors[0].rate_limit.algorithm: unknown algorithm 'leaky'",
    ),
    (
        "rate_limit: {unit: second, requests_per_unit: 5, burst: 10}",
        "5: descriptors[0].rate_limit.burst: only applies to algorithm token_bucket",
    ),
    (
        "rate_limit: {unit: second, requests_per_unit: 5, on_store_failure: deny}",
        "5: descriptors[0].rate_limit.on_store_failure: only applies to consistency: strict",
    ),
    (
        "rate_limit: {unit: second, requests_per_unit: 5, consistency: exact}",
        "5: descriptors[0].rate_limit.consistency: must be one of eventual, edge, strict",
    ),
    (
        "rate_limit: {unit: second, requests_per_unit: 200000, algorithm: sliding_log}",
        "5: descriptors[0].rate_limit.requests_per_unit: must be at most 100000",
    ),
    (
        "rate_limit: {unit: second, requests_per_unit: 5}\n"
        "    rate_limits: [{unit: day, requests_per_unit: 9}]",
        "6: descriptors[0].rate_limits: must not be set together with rate_limit",
    ),
    (
        "rate_limits: []",
        "5: descriptors[0].rate_limits: must be a non-empty list of rate limits",
    ),
    (
        "rate_limits:\n      - {unlimited: true}",
        "6: descriptors[0].rate_limits[0].unlimited: unlimited is only allowed in a single",
    ),
]


@pytest.mark.parametrize(("limit", "expected"), BAD)
def test_a_bad_combination_names_file_line_and_key(
    tmp_path: Path, limit: str, expected: str
) -> None:
    path = write(tmp_path, f"domain: d\ndescriptors:\n  - key: k\n\n    {limit}\n")
    with pytest.raises(ConfigError) as caught:
        load_rules(path)
    assert f"{path}:{expected}" in str(caught.value)


def test_an_eventual_sliding_log_is_refused_only_with_a_shared_store(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "domain: d\ndescriptors:\n  - key: k\n"
        "    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_log}\n",
    )
    assert load_rules(path).domain("d") is not None  # local-only: exact, fine
    with pytest.raises(ConfigError) as caught:
        load_rules(path, defaults=RuleDefaults(shared_store=True))
    assert f"{path}:4: descriptors[0].rate_limit.algorithm: sliding_log without consistency" in str(
        caught.value
    )


def test_settings_refuse_an_unknown_default_algorithm() -> None:
    with pytest.raises(ValueError, match="--default-algorithm must be one of"):
        Settings(config_path="x", default_algorithm="leaky")
    chosen = Settings(config_path="x", default_algorithm="token_bucket", redis_url="redis://h")
    assert chosen.rule_defaults == RuleDefaults(AlgorithmName.TOKEN_BUCKET, shared_store=True)


CONSISTENCIES = """\
domain: d
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: named
    rate_limit: {unit: minute, requests_per_unit: 5, consistency: eventual}
  - key: search
    rate_limit: {unit: minute, requests_per_unit: 600, algorithm: sliding_window}
  - key: tokens
    rate_limit: {unit: day, requests_per_unit: 2000000, count_refused: true}
"""


def limit_of(tmp_path: Path, key: str, defaults: RuleDefaults) -> RateLimit:
    domain = load_rules(write(tmp_path, CONSISTENCIES), defaults=defaults).domain("d")
    assert domain is not None
    found = match(domain, [(key, "v")])
    assert found is not None and found.limit is not None
    return found.limit


def test_limits_are_at_the_edge_by_default_with_a_store(tmp_path: Path) -> None:
    shared = RuleDefaults(shared_store=True)
    assert limit_of(tmp_path, "plain", shared).edge
    assert not limit_of(tmp_path, "named", shared).edge  # eventual, as the rule says
    assert limit_of(tmp_path, "search", shared).edge  # a sliding window too
    assert not limit_of(tmp_path, "plain", RuleDefaults()).edge  # local-only: nothing to sync
    eventual = RuleDefaults(consistency=Consistency.EVENTUAL, shared_store=True)
    assert not limit_of(tmp_path, "plain", eventual).edge


def test_count_refused_loads_on_its_limit_only(tmp_path: Path) -> None:
    assert limit_of(tmp_path, "tokens", RuleDefaults()).count_refused
    assert not limit_of(tmp_path, "plain", RuleDefaults()).count_refused


def test_edge_on_a_sliding_log_names_file_line_and_key(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit:"
        " 5, algorithm: sliding_log, consistency: edge}\n",
    )
    with pytest.raises(ConfigError) as caught:
        load_rules(path, defaults=RuleDefaults(shared_store=True))
    expected = "4: descriptors[0].rate_limit.algorithm: sliding_log without consistency: strict"
    assert f"{path}:{expected}" in str(caught.value)


def test_settings_choose_the_default_consistency() -> None:
    with pytest.raises(ValueError, match="--default-consistency must be one of"):
        Settings(config_path="x", default_consistency="exact")
    chosen = Settings(config_path="x", default_consistency="eventual", redis_url="redis://h")
    assert chosen.rule_defaults.consistency is Consistency.EVENTUAL
    assert Settings(config_path="x").rule_defaults.consistency is Consistency.EDGE

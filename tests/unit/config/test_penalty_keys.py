"""`penalty:` per limit and as a domain default: what loads, and each refusal with file, line
and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratelimit_sidecar.config import ConfigError, load_rules
from ratelimit_sidecar.config.matcher import match
from ratelimit_sidecar.config.model import Penalty, RateLimit

GOOD = """\
domain: d
penalty: {factor: 3, max: 10m, forgive_after: 600}
descriptors:
  - key: own
    rate_limit:
      unit: second
      requests_per_unit: 5
      penalty: {factor: 1.5, max: "1h", forgive_after: "10m"}
  - key: inherits
    rate_limits:
      - {unit: second, requests_per_unit: 5, cooldown: 30s}
      - {unit: minute, requests_per_unit: 50, algorithm: sliding_window}
  - key: opted_out
    rate_limit: {unit: second, requests_per_unit: 5, penalty: null}
  - key: too_long
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: strict
    rate_limit: {unit: second, requests_per_unit: 5, consistency: strict}
  - key: ends_with_window
    rate_limit: {unit: second, requests_per_unit: 5, cooldown: window_end}
"""


def _limits(tmp_path: Path, text: str, key: str) -> tuple[RateLimit, ...]:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    domain = load_rules(path).domain("d")
    assert domain is not None
    rule = match(domain, [(key, "x")])
    assert rule is not None
    return rule.limits


def test_a_limit_reads_its_own_penalty(tmp_path: Path) -> None:
    (limit,) = _limits(tmp_path, GOOD, "own")
    assert limit.penalty == Penalty(1.5, 3_600_000, 600_000)


def test_the_domain_default_applies_to_limits_that_block(tmp_path: Path) -> None:
    default = Penalty(3.0, 600_000, 600_000)
    blocking, never_blocks = _limits(tmp_path, GOOD, "inherits")
    assert blocking.penalty == default
    assert never_blocks.penalty is None  # a sliding window without cooldown never blocks
    assert _limits(tmp_path, GOOD, "strict")[0].penalty == default  # strict.lua applies it
    for key in ("opted_out", "too_long", "ends_with_window"):
        assert _limits(tmp_path, GOOD, key)[0].penalty is None, key


def test_a_file_without_penalty_has_none(tmp_path: Path) -> None:
    text = "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}"
    assert _limits(tmp_path, text, "k")[0].penalty is None


BAD = [
    (
        "rate_limit: {unit: second, requests_per_unit: 5, penalty: {max: 1h}}",
        "5: descriptors[0].rate_limit.penalty.forgive_after: required key is missing",
    ),
    (
        "rate_limit: {unit: second, requests_per_unit: 5, penalty: {max: 1h, forgive_after: 0}}",
        "5: descriptors[0].rate_limit.penalty.forgive_after: must be a positive number",
    ),
    (
        "rate_limit: {unit: second, requests_per_unit: 5,\n"
        "      penalty: {max: 1h, forgive_after: 1m, factor: 1}}",
        "6: descriptors[0].rate_limit.penalty.factor: must be a number above 1 and at most 100",
    ),
    (
        "rate_limit: {unit: second, requests_per_unit: 5,\n"
        "      penalty: {max: 1h, forgive_after: 1m, growth: 2}}",
        "6: descriptors[0].rate_limit.penalty.growth: unknown key (allowed here: factor, max,",
    ),
    (
        "rate_limit: {unit: second, requests_per_unit: 5, penalty: 2}",
        "5: descriptors[0].rate_limit.penalty: must be a mapping like {factor: 2, max: 1h",
    ),
    (
        "rate_limit: {unit: minute, requests_per_unit: 5, penalty: {max: 30s, forgive_after: 1m}}",
        "5: descriptors[0].rate_limit.penalty.max: max must be at least the cooldown (60000 ms)",
    ),
    (
        "rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket,\n"
        "      penalty: {max: 1h, forgive_after: 1m}}",
        "6: descriptors[0].rate_limit.penalty: needs a block: a fixed window without cooldown:"
        " window_end, or cooldown: set (this token_bucket limit never blocks)",
    ),
    (
        "rate_limit: {unit: second, requests_per_unit: 5, cooldown: window_end,\n"
        "      penalty: {max: 1h, forgive_after: 1m}}",
        "6: descriptors[0].rate_limit.penalty: needs a block",
    ),
    (
        "rate_limit: {unlimited: true, penalty: {max: 1h, forgive_after: 1m}}",
        "5: descriptors[0].rate_limit.penalty: must not be set when unlimited is true",
    ),
]


@pytest.mark.parametrize(("limit", "expected"), BAD)
def test_a_bad_penalty_names_file_line_and_key(tmp_path: Path, limit: str, expected: str) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(f"domain: d\ndescriptors:\n  - key: k\n\n    {limit}\n")
    with pytest.raises(ConfigError) as caught:
        load_rules(path)
    assert f"{path}:{expected}" in str(caught.value)


def test_a_bad_domain_default_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("domain: d\n\npenalty: {max: soon, forgive_after: 1m}\ndescriptors: []\n")
    with pytest.raises(ConfigError) as caught:
        load_rules(path)
    assert f"{path}:3: penalty.max: must be a positive number of seconds" in str(caught.value)

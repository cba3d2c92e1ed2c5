from __future__ import annotations

import shutil
from pathlib import Path
from types import MappingProxyType

import pytest

from ratelimit_sidecar.config import (
    MIN_SPAN_MS,
    ConfigError,
    DescriptorNode,
    Domain,
    Problem,
    RuleSet,
    Source,
    Unit,
    load_rules,
)

FIXTURES = Path(__file__).parent / "fixtures"
ERRORS = FIXTURES / "errors"
REFERENCE = FIXTURES / "reference"


def _domain(rules: RuleSet, name: str) -> Domain:
    domain = rules.domain(name)
    assert domain is not None, f"domain {name!r} not loaded"
    return domain


def _keyed(node: DescriptorNode, key: str) -> DescriptorNode:
    return node.keyed[key]


def test_spec_example_builds_the_tree() -> None:
    path = FIXTURES / "spec_example.yaml"
    domain = _domain(load_rules(path), "gateway")

    assert domain.source == Source(str(path), 2)
    root = domain.root
    assert root.rule.domain == "gateway"
    assert root.rule.path == ()
    assert root.rule.limit is None

    api_key = _keyed(root, "api_key")
    assert api_key.rule.path == (("api_key", ""),)
    assert api_key.rule.limit is not None
    assert (api_key.rule.limit.requests_per_unit, api_key.rule.limit.unit) == (100, Unit.MINUTE)
    assert api_key.rule.source == Source(str(path), 4)

    orders = api_key.exact[("path", "/v1/orders")]
    assert orders.rule.path == (("api_key", ""), ("path", "/v1/orders"))
    assert orders.rule.limit is not None
    assert orders.rule.limit.name == "orders-writes"
    assert orders.rule.limit.requests_per_unit == 20

    internal = root.exact[("tier", "internal")]
    assert internal.rule.unlimited is True
    assert internal.rule.limit is None

    [wildcard] = root.wildcards
    assert wildcard.key == "remote_address"
    assert wildcard.pattern.fullmatch("10.9.1.2")
    assert not wildcard.pattern.fullmatch("10.90.1.2")
    assert wildcard.node.rule.path == (("remote_address", "10.9.*"),)
    assert wildcard.node.rule.shadow_mode is True
    assert wildcard.node.rule.limit is not None
    assert wildcard.node.rule.limit.requests_per_unit == 0  # a deny list, not "no limit"
    assert wildcard.node.rule.source == Source(str(path), 13)


def test_tree_is_read_only() -> None:
    root = _domain(load_rules(FIXTURES / "spec_example.yaml"), "gateway").root

    assert isinstance(root.exact, MappingProxyType)
    assert isinstance(root.keyed, MappingProxyType)
    with pytest.raises(TypeError):
        root.keyed["x"] = root  # type: ignore[index]


def test_version_is_stable_and_follows_content(tmp_path: Path) -> None:
    copy = tmp_path / "spec_example.yaml"  # same name: the version hashes names and bytes
    shutil.copy(FIXTURES / "spec_example.yaml", copy)
    first = load_rules(copy).version

    assert len(first) == 12
    assert int(first, 16) >= 0
    assert load_rules(copy).version == first
    assert load_rules(FIXTURES / "spec_example.yaml").version == first

    copy.write_text(copy.read_text().replace("requests_per_unit: 100", "requests_per_unit: 101"))
    assert load_rules(copy).version != first


def test_directory_loads_sorted_visible_yaml_files_only() -> None:
    directory = FIXTURES / "multi"

    rules = load_rules(directory)

    assert list(rules.domains) == ["gateway", "internal"]
    assert _domain(rules, "gateway").source == Source(str(directory / "a_gateway.yaml"), 1)
    internal = _domain(rules, "internal").root
    assert internal.exact[("service", "billing")].rule.limit is not None
    assert internal.keyed["service"].rule.unlimited is True


def test_duplicate_domain_names_both_files() -> None:
    directory = FIXTURES / "duplicate_domain"

    with pytest.raises(ConfigError) as caught:
        load_rules(directory)

    assert str(caught.value) == (
        f"{directory / 'two.yaml'}:3: domain: duplicate domain 'shop'"
        f" (already defined at {directory / 'one.yaml'}:1)"
    )


def test_missing_path_is_reported() -> None:
    path = FIXTURES / "does_not_exist.yaml"

    with pytest.raises(ConfigError) as caught:
        load_rules(str(path))

    assert caught.value.problems == [Problem(str(path), 0, "file", "no such file or directory")]


def test_one_bad_file_rejects_the_whole_directory(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "multi" / "a_gateway.yaml", tmp_path / "a.yaml")
    shutil.copy(ERRORS / "bad_unit.yaml", tmp_path / "b.yaml")

    with pytest.raises(ConfigError) as caught:
        load_rules(tmp_path)

    assert [(p.file, p.line, p.key) for p in caught.value.problems] == [
        (str(tmp_path / "b.yaml"), 5, "descriptors[0].rate_limit.unit")
    ]


@pytest.mark.parametrize("name", sorted(p.name for p in REFERENCE.glob("*.yaml")))
def test_reference_configs_load_unchanged(name: str) -> None:
    rules = load_rules(REFERENCE / name)

    assert len(rules.domains) == 1


def test_reference_example_semantics() -> None:
    foo = _domain(load_rules(REFERENCE / "example.yaml"), "rl").root.keyed["foo"]

    banned = foo.exact[("bar", "banned")].rule.limit
    assert banned is not None
    assert banned.requests_per_unit == 0
    assert foo.keyed["bay"].rule.unlimited is True
    assert foo.exact[("baz", "shady")].rule.shadow_mode is True


def test_reference_basic_config_has_every_descriptor() -> None:
    domain = _domain(load_rules(REFERENCE / "basic_config.yaml"), "test-domain")

    assert [rule.id for rule in domain.rules()] == [
        "test-domain.key1_value1",
        "test-domain.key1_value1.subkey1_subvalue1",
        "test-domain.key1_value1.subkey1",
        "test-domain.key2_value2",
        "test-domain.key2_value3",
        "test-domain.key5_value5",
        "test-domain.key5_value5.subkey5_subvalue5",
        "test-domain.key2",
        "test-domain.key3",
        "test-domain.key4",
    ]
    assert domain.root.exact[("key2", "value3")].rule.limit is None  # listed without a limit


def test_reference_wildcards_include_infix() -> None:
    root = _domain(load_rules(REFERENCE / "wildcard.yaml"), "test-domain").root

    assert [(w.key, w.node.rule.path[-1][1]) for w in root.wildcards] == [
        ("wild", "foo*"),
        ("midWild", "bar*b"),
    ]
    assert ("noWild", "foo") in root.exact


def test_reference_unit_multiplier_matches_our_extension() -> None:
    root = _domain(load_rules(REFERENCE / "unit_multiplier.yaml"), "test-domain").root

    limit = root.keyed["key1"].rule.limit
    assert limit is not None
    assert (limit.unit_multiplier, limit.window_seconds) == (5, 300)


def test_reference_share_threshold_marks_shared_levels() -> None:
    root = _domain(load_rules(REFERENCE / "share_threshold.yaml"), "test-domain").root
    by_value = {w.node.rule.path[-1][1]: w.node for w in root.wildcards}

    user = by_value["user/*"]
    action = user.wildcards[0].node.keyed["action"]
    assert action.rule.shared_levels == (0, 1)
    path_type = by_value["path/*"].wildcards[0].node.keyed["type"]
    assert path_type.rule.shared_levels == (0,)  # file/* says share_threshold: false
    assert by_value["api/*"].rule.value_to_metric is True
    method = by_value["api/*"].keyed["method"].rule
    assert (method.shared_levels, method.valued_levels) == ((0,), ())  # share_threshold wins
    assert root.exact[("file", "test1")].rule.shared_levels == ()


def test_value_to_metric_marks_its_level_for_every_rule_below() -> None:
    path = Path(__file__).parent.parent / "fixtures" / "value_to_metric.yaml"
    root = _domain(load_rules(path), "shop").root

    tenant = root.keyed["tenant"]
    user = tenant.keyed["verb"].keyed["user"].rule
    assert (tenant.rule.valued_levels, user.valued_levels) == ((0,), (0, 1))
    assert user.value_to_metric is False  # its own flag; the levels come from above
    assert root.keyed["region"].keyed["zone"].keyed["host"].rule.valued_levels == (1,)
    assert root.keyed["client"].rule.valued_levels == ()


def test_extensions_are_parsed() -> None:
    root = _domain(load_rules(FIXTURES / "extensions.yaml"), "ext").root

    def limit_of(key: str) -> tuple[int, int, int, int]:
        limit = root.keyed[key].rule.limit
        assert limit is not None
        return limit.window_seconds, limit.spans, limit.cooldown_ms, limit.cooldown

    assert limit_of("plain") == (60, 6, 0, 60_000)  # default cooldown: one window
    assert limit_of("multiplied") == (300, 10, 0, 300_000)
    assert limit_of("ms_cooldown") == (1, 20, 500, 500)
    assert limit_of("int_cooldown")[2] == 30_000
    assert limit_of("s_cooldown")[2] == 30_000
    assert limit_of("m_cooldown")[2] == 300_000
    assert limit_of("h_cooldown")[2:] == (3_600_000, 3_600_000)
    assert limit_of("tightest")[:2] == (1, 1000 // MIN_SPAN_MS)  # exactly spans x 50 ms


def test_units_are_case_insensitive_and_have_fixed_lengths() -> None:
    root = _domain(load_rules(FIXTURES / "extensions.yaml"), "ext").root

    def unit_of(key: str) -> Unit:
        limit = root.keyed[key].rule.limit
        assert limit is not None
        return limit.unit

    assert unit_of("h_cooldown") is Unit.WEEK  # written WEEK
    assert unit_of("month") is Unit.MONTH  # written Month
    assert unit_of("year") is Unit.YEAR


@pytest.mark.parametrize(
    ("unit", "seconds"),
    [
        (Unit.SECOND, 1),
        (Unit.MINUTE, 60),
        (Unit.HOUR, 3600),
        (Unit.DAY, 86_400),
        (Unit.WEEK, 604_800),
        (Unit.MONTH, 30 * 86_400),
        (Unit.YEAR, 365 * 86_400),
    ],
)
def test_unit_seconds(unit: Unit, seconds: int) -> None:
    assert unit.seconds == seconds


def test_scalars_read_like_the_reference() -> None:
    root = _domain(load_rules(FIXTURES / "extensions.yaml"), "ext").root

    numeric = root.exact[("numeric", "200")].rule  # `value: 200` is the string "200"
    assert numeric.limit is not None
    assert numeric.limit.requests_per_unit == 16  # YAML 1.1 hex, as yaml.v2 reads it
    assert numeric.detailed_metric is True  # `yes`
    assert numeric.value_to_metric is True


def test_reference_defaults_missing_requests_per_unit_and_empty_value(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(
        "domain: d\ndescriptors:\n  - key: k\n    value: ''\n    rate_limit: {unit: hour}\n"
    )

    node = _domain(load_rules(path), "d").root.keyed["k"]

    assert node.rule.path == (("k", ""),)
    assert node.rule.limit is not None
    assert node.rule.limit.requests_per_unit == 0


UNITS = "second, minute, hour, day, week, month, year"
RATE_LIMIT_KEYS = (
    "unit, requests_per_unit, unlimited, name, replaces, unit_multiplier, spans, cooldown,"
    " algorithm, burst, consistency, on_store_failure, count_refused, penalty"
)
DESCRIPTOR_KEYS = (
    "key, value, rate_limit, rate_limits, descriptors, shadow_mode, quota_mode, detailed_metric,"
    " value_to_metric, share_threshold, metadata"
)
EXPECTED_ERRORS: dict[str, list[str]] = {
    "bad_cooldown.yaml": [
        "7: descriptors[0].rate_limit.cooldown: must be a positive number of seconds, a duration"
        " like '500ms', '30s', '5m', '1h', or window_end (got '5min')"
    ],
    "bad_flag.yaml": ["4: descriptors[0].shadow_mode: must be true or false (got 'sometimes')"],
    "bad_unit.yaml": [
        f"5: descriptors[0].rate_limit.unit: invalid unit 'fortnight' (expected one of {UNITS})"
    ],
    "descriptor_not_a_mapping.yaml": [
        "4: descriptors[0]: must be a mapping with at least 'key' (got 'a')",
        "5: descriptors[1]: must be a mapping with at least 'key' (got 'b')",
        "6: descriptors[2]: must be a mapping with at least 'key' (got 'c')",
    ],
    "descriptor_without_key.yaml": [
        "5: descriptors[0].descriptors[0].key: required key is missing"
    ],
    "descriptors_not_a_list.yaml": [
        "5: descriptors[0].descriptors: must be a list of descriptors (got a mapping)"
    ],
    "duplicate_descriptor.yaml": [
        "7: descriptors[1]: duplicate descriptor key 'key1' value 'value1' (first at line 4)"
    ],
    "duplicate_yaml_key.yaml": ["5: descriptors[0].rate_limit: duplicate key (first at line 4)"],
    "empty_domain.yaml": ["1: domain: must not be empty"],
    "empty_file.yaml": ["1: domain: required key is missing (the file is empty)"],
    "many_problems.yaml": [  # sorted by line although checks run in another order
        f"5: descriptors[0].rate_limit.unit: invalid unit 'fortnight' (expected one of {UNITS})",
        "6: descriptors[0].rate_limit.requests_per_unit: must be an integer from 0 to 4294967295"
        " (got 'ten')",
        f"9: descriptors[0].descriptors[0].colour: unknown key (allowed here: {DESCRIPTOR_KEYS})",
        "10: descriptors[1].key: required key is missing",
    ],
    "misplaced_key.yaml": [
        f"8: descriptors[0].rate_limit.shadow_mode: unknown key (allowed here: {RATE_LIMIT_KEYS})"
    ],
    "missing_domain.yaml": ["1: domain: required key is missing"],
    "missing_unit.yaml": [
        f"4: descriptors[0].rate_limit.unit: required key is missing (one of {UNITS})"
    ],
    "negative_requests_per_unit.yaml": [
        "4: descriptors[0].rate_limit.requests_per_unit: must be an integer from 0 to 4294967295"
        " (got '-1')"
    ],
    "non_integer_requests_per_unit.yaml": [
        "4: descriptors[0].rate_limit.requests_per_unit: must be an integer from 0 to 4294967295"
        " (got '1.5')"
    ],
    "non_string_key.yaml": ["4: descriptors[0]: keys must be strings (got '0.25')"],
    "not_a_mapping.yaml": [
        "1: (root): must be a mapping with 'domain' and 'descriptors' (got a list)"
    ],
    "replaces_empty.yaml": [
        "11: descriptors[0].descriptors[0].rate_limit.replaces[0].name: must not be empty"
    ],
    "replaces_self.yaml": [
        "11: descriptors[0].descriptors[0].rate_limit.replaces[0].name:"
        " must not name its own rate limit"
    ],
    "share_threshold_without_wildcard.yaml": [
        "5: descriptors[0].share_threshold: only allowed on a wildcard value (one containing '*')"
    ],
    "spans_too_small.yaml": [
        "4: descriptors[0].rate_limit.spans: must be an integer from 2 to 3600 (got '1')"
    ],
    "spans_too_large.yaml": [
        "4: descriptors[0].rate_limit.spans: must be an integer from 2 to 3600 (got '100000000')"
    ],
    "too_large_requests_per_unit.yaml": [
        "4: descriptors[0].rate_limit.requests_per_unit: must be an integer from 0 to 4294967295"
        " (got '4294967296')"
    ],
    "unknown_key_descriptor.yaml": [
        f"6: descriptors[0].ratelimit: unknown key (allowed here: {DESCRIPTOR_KEYS})"
    ],
    "unknown_key_rate_limit.yaml": [
        "6: descriptors[0].rate_limit.requests_per_minute: unknown key"
        f" (allowed here: {RATE_LIMIT_KEYS})"
    ],
    "unknown_key_root.yaml": [
        "2: descriptor: unknown key (allowed here: domain, descriptors, penalty)"
    ],
    "unlimited_with_unit.yaml": [
        "7: descriptors[0].rate_limit.unit: must not be set when unlimited is true",
        "8: descriptors[0].rate_limit.requests_per_unit: must not be set when unlimited is true",
    ],
    "window_too_short.yaml": [
        "7: descriptors[0].rate_limit.spans: window of 1000 ms is shorter than 30 spans"
        " x 50 ms = 1500 ms"
    ],
    "window_too_long.yaml": [
        "7: descriptors[0].rate_limit.unit_multiplier: window of 367 days (unit x"
        " unit_multiplier) is longer than 366 days"
    ],
    "yaml_syntax.yaml": [
        "4: yaml: invalid YAML: expected <block end>, but found '<block mapping start>'"
        " (while parsing a block collection at line 3)"
    ],
    "zero_unit_multiplier.yaml": [
        "9: descriptors[0].rate_limit.unit_multiplier: must be an integer >= 1 (got '0')"
    ],
}


@pytest.mark.parametrize(("name", "expected"), sorted(EXPECTED_ERRORS.items()))
def test_error_fixture_reports_exact_problems(name: str, expected: list[str]) -> None:
    path = ERRORS / name

    with pytest.raises(ConfigError) as caught:
        load_rules(path)

    assert str(caught.value) == "\n".join(f"{path}:{line}" for line in expected)


def test_every_error_fixture_has_expectations() -> None:
    assert sorted(p.name for p in ERRORS.glob("*.yaml")) == sorted(EXPECTED_ERRORS)


def test_problem_fields_are_separate() -> None:
    path = ERRORS / "bad_unit.yaml"

    with pytest.raises(ConfigError) as caught:
        load_rules(path)

    [problem] = caught.value.problems
    assert (problem.file, problem.line, problem.key) == (
        str(path),
        5,
        "descriptors[0].rate_limit.unit",
    )

"""`RateLimitConfig` resources (xDS) into the rule set a rule file gives, and their problems."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from google.protobuf.any_pb2 import Any as AnyMessage
from google.protobuf.struct_pb2 import Struct

from harness.xds_server import gateway_config
from ratelimit_sidecar._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2 as rls
from ratelimit_sidecar.config import ConfigError, load_rules
from ratelimit_sidecar.config.limits import ConfigLimits
from ratelimit_sidecar.config.model import Unit
from ratelimit_sidecar.config.xds_rules import (
    RESOURCE_TYPE,
    config_yaml,
    problem_text,
    rules_from_configs,
    unpack,
)

Descriptor, Policy = rls.RateLimitDescriptor, rls.RateLimitPolicy


def test_an_envoy_gateway_resource_becomes_the_nested_rules() -> None:
    rules = rules_from_configs([gateway_config()])
    domain = rules.domain("default/eg/http")
    assert domain is not None
    header = domain.root.exact[("rule-0-match-0", "rule-0-match-0")]
    leaf = header.exact[("masked_remote_address", "0.0.0.0/0")].keyed["remote_address"].rule
    assert leaf.limit is not None
    assert (leaf.limit.requests_per_unit, leaf.limit.unit) == (10, Unit.MINUTE)
    shadow = domain.root.exact[("rule-1-match--1", "rule-1-match--1")].rule
    assert shadow.shadow_mode is True
    assert shadow.limit is not None and shadow.limit.unit is Unit.WEEK


def test_the_dump_is_the_rule_file_that_loads_the_same_rules(tmp_path: Path) -> None:
    config = gateway_config()
    text = config_yaml(config)
    assert yaml.safe_load(text)["descriptors"][0]["descriptors"][0]["value"] == "0.0.0.0/0"
    (tmp_path / "gw.yaml").write_text(text)
    from_file = load_rules(tmp_path / "gw.yaml").domain("default/eg/http")
    from_xds = rules_from_configs([config]).domain("default/eg/http")
    assert from_file is not None and from_xds is not None
    assert [r.path for r in from_file.rules()] == [r.path for r in from_xds.rules()]
    assert [r.limits for r in from_file.rules()] == [r.limits for r in from_xds.rules()]


def test_every_field_of_the_reference_is_carried() -> None:
    metadata = Struct()
    metadata.update({"plan": "gold", "weight": 2})
    named = Descriptor(
        key="k",
        value="v",
        detailed_metric=True,
        quota_mode=True,
        metadata=metadata,
        rate_limit=Policy(unit=rls.HOUR, requests_per_unit=5, name="tight"),
    )
    unlimited = Descriptor(
        key="k",
        value="vip",
        rate_limit=Policy(unlimited=True, replaces=[rls.RateLimitReplace(name="tight")]),
    )
    config = rls.RateLimitConfig(name="n", domain="d", descriptors=[named, unlimited])
    domain = rules_from_configs([config]).domain("d")
    assert domain is not None
    rule = domain.root.exact[("k", "v")].rule
    assert (rule.detailed_metric, rule.quota_mode, rule.metadata) == (
        True,
        True,
        {"plan": "gold", "weight": 2.0},
    )
    assert rule.limit is not None and rule.limit.name == "tight"
    vip = domain.root.exact[("k", "vip")].rule
    assert vip.unlimited and vip.replaces == ("tight",)


def test_each_response_is_the_whole_set_and_the_version_follows_the_content() -> None:
    one = rules_from_configs([gateway_config(10)])
    same = rules_from_configs([gateway_config(10)])
    other = rules_from_configs([gateway_config(11)])
    assert one.version == same.version != other.version
    assert rules_from_configs([]).domains == {}


def test_a_problem_names_the_resource_and_the_field() -> None:
    bad = gateway_config()
    bad.descriptors[0].descriptors[0].descriptors[0].rate_limit.unit = rls.UNKNOWN
    with pytest.raises(ConfigError) as caught:
        rules_from_configs([bad])
    text = problem_text(caught.value.problems)
    assert text.startswith(
        "resource 'default/eg/http': "
        "descriptors[0].descriptors[0].descriptors[0].rate_limit.unit: invalid unit 'UNKNOWN'"
    )


def test_the_yaml_readers_checks_apply_unlimited_with_a_unit_and_empty_keys() -> None:
    config = rls.RateLimitConfig(
        name="x",
        domain="d",
        descriptors=[
            Descriptor(key="a", rate_limit=Policy(unit=rls.SECOND, unlimited=True)),
            Descriptor(key=""),
        ],
    )
    with pytest.raises(ConfigError) as caught:
        rules_from_configs([config])
    keys = [(p.file, p.key) for p in caught.value.problems]
    assert keys == [
        ("resource 'x'", "descriptors[0].rate_limit.unit"),
        ("resource 'x'", "descriptors[1].key"),
    ]


def test_two_resources_for_one_domain_are_refused() -> None:
    first, second = gateway_config(), gateway_config()
    second.name = "again"
    with pytest.raises(ConfigError) as caught:
        rules_from_configs([first, second])
    assert problem_text(caught.value.problems) == (
        "resource 'again': domain: duplicate domain 'default/eg/http'"
        " (already in resource 'default/eg/http')"
    )


def test_the_rule_file_bounds_apply() -> None:
    with pytest.raises(ConfigError) as caught:
        rules_from_configs([gateway_config()], ConfigLimits(max_rule_descriptors=2))
    assert "descriptors" in problem_text(caught.value.problems)


def test_unpack_takes_only_rate_limit_configs() -> None:
    good = AnyMessage()
    good.Pack(gateway_config(), type_url_prefix="type.googleapis.com/")
    assert good.type_url == RESOURCE_TYPE
    other = AnyMessage(type_url="type.googleapis.com/envoy.config.cluster.v3.Cluster")
    broken = AnyMessage(type_url=RESOURCE_TYPE, value=b"\xff\xff")
    assert unpack([good]) == [gateway_config()]
    with pytest.raises(ConfigError) as caught:
        unpack([good, other, broken])
    assert [(p.file, p.key) for p in caught.value.problems] == [
        ("resources[1]", "type_url"),
        ("resources[2]", "value"),
    ]

"""Rules from xDS: `RateLimitConfig` resources into the `RuleSet` a rule directory would give.

Each resource is rendered as the rule file the reference would read (its `ConfigXdsProtoToYaml`
maps field to key) and read by the rule files' reader: same keys, bounds and messages, and a key
path is the proto's field path. Problems name the resource, not a YAML line (`problem_text`, a
NACK's `error_detail`). As in the reference, `unit` UNKNOWN is no unit, and an unlimited policy's
`requests_per_unit` is ignored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from types import MappingProxyType

import yaml
from google.protobuf.any_pb2 import Any as AnyMessage
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError

from ratelimit_sidecar._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2

from .errors import ConfigError, Problem
from .limits import (
    DEFAULT_LIMITS,
    ConfigLimits,
    DescriptorBudget,
    LimitExceeded,
    Pacer,
    collector_paused,
    never_stopped,
)
from .model import DEFAULT_RULES, Domain, RuleDefaults, RuleSet
from .rulefile import RuleFileReader

RateLimitConfig = rls_conf_pb2.RateLimitConfig
RESOURCE_TYPE = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

Document = dict[str, object]


def config_document(config: rls_conf_pb2.RateLimitConfig) -> Document:
    return {"domain": config.domain, "descriptors": [_descriptor(d) for d in config.descriptors]}


def _descriptor(descriptor: rls_conf_pb2.RateLimitDescriptor) -> Document:
    document: Document = {"key": descriptor.key}
    if descriptor.value:
        document["value"] = descriptor.value
    if descriptor.HasField("rate_limit"):
        document["rate_limit"] = _policy(descriptor.rate_limit)
    for flag in ("shadow_mode", "detailed_metric", "quota_mode"):
        if getattr(descriptor, flag):
            document[flag] = True
    if descriptor.HasField("metadata"):
        document["metadata"] = MessageToDict(descriptor.metadata)
    if descriptor.descriptors:
        document["descriptors"] = [_descriptor(child) for child in descriptor.descriptors]
    return document


def _policy(policy: rls_conf_pb2.RateLimitPolicy) -> Document:
    document: Document = {}
    if policy.unit != rls_conf_pb2.UNKNOWN or not policy.unlimited:
        document["unit"] = rls_conf_pb2.RateLimitUnit.Name(policy.unit)
    if policy.unlimited:
        document["unlimited"] = True
    else:
        document["requests_per_unit"] = policy.requests_per_unit
    if policy.name:
        document["name"] = policy.name
    if policy.replaces:
        document["replaces"] = [{"name": replace.name} for replace in policy.replaces]
    return document


def config_yaml(config: rls_conf_pb2.RateLimitConfig) -> str:
    """As a rule file (what `xds-dump` prints)."""
    return yaml.safe_dump(
        config_document(config), sort_keys=False, allow_unicode=True, default_flow_style=False
    )


def resource_label(index: int, config: rls_conf_pb2.RateLimitConfig | None = None) -> str:
    """By name, else by place in the response."""
    if config is not None and config.name:
        return f"resource '{config.name}'"
    return f"resources[{index}]"


def unpack(resources: Sequence[AnyMessage]) -> list[rls_conf_pb2.RateLimitConfig]:
    configs, problems = [], []
    for index, resource in enumerate(resources):
        label = resource_label(index)
        if resource.type_url != RESOURCE_TYPE:
            message = f"not a RateLimitConfig (expected {RESOURCE_TYPE})"
            problems.append(Problem(label, 0, "type_url", f"'{resource.type_url}' is {message}"))
            continue
        config = RateLimitConfig()
        try:
            config.ParseFromString(resource.value)
        except DecodeError as exc:
            problems.append(Problem(label, 0, "value", f"cannot be decoded: {exc}"))
            continue
        configs.append(config)
    if problems:
        raise ConfigError(problems)
    return configs


def rules_from_configs(
    configs: Sequence[rls_conf_pb2.RateLimitConfig],
    limits: ConfigLimits = DEFAULT_LIMITS,
    defaults: RuleDefaults = DEFAULT_RULES,
    stopped: Callable[[], bool] = never_stopped,
) -> RuleSet:
    """One domain per resource; `ConfigError` on any problem (`problem_text`)."""
    problems: list[Problem] = []
    domains: dict[str, Domain] = {}
    owners: dict[str, str] = {}
    digest = hashlib.sha256()
    budget = DescriptorBudget(limits.max_rule_descriptors, Pacer(stopped))
    with collector_paused():
        for index, config in enumerate(configs):
            label = resource_label(index, config)
            data = config_yaml(config).encode()
            digest.update(b"%s\0%d\0" % (config.name.encode(), len(data)) + data)
            domain = _domain(
                label, data, budget=budget, limits=limits, defaults=defaults, problems=problems
            )
            if domain is None:
                continue
            if domain.name in owners:
                message = f"duplicate domain '{domain.name}' (already in {owners[domain.name]})"
                problems.append(Problem(label, 0, "domain", message))
                continue
            domains[domain.name], owners[domain.name] = domain, label
    if problems:
        raise ConfigError(problems)
    return RuleSet(MappingProxyType(domains), version=digest.hexdigest()[:12])


def _domain(
    label: str,
    data: bytes,
    *,
    budget: DescriptorBudget,
    limits: ConfigLimits,
    defaults: RuleDefaults,
    problems: list[Problem],
) -> Domain | None:
    if len(data) > limits.max_rule_file_bytes:
        message = f"{len(data)} bytes as YAML, more than the {limits.max_rule_file_bytes} allowed"
        problems.append(Problem(label, 0, "(root)", message))
        return None
    reader = RuleFileReader(label, budget, limits.max_yaml_nodes, defaults)
    try:
        domain = reader.load(data)
    except LimitExceeded as exc:
        problems.append(exc.problem)
        return None
    problems.extend(sorted(reader.problems, key=lambda problem: problem.line))
    return domain


def problem_text(problems: Iterable[Problem]) -> str:
    return "; ".join(f"{p.file}: {p.key}: {p.message}" for p in problems)

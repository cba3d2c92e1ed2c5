"""Build one rule file's domain from its YAML node tree, checking every key on the way.

Keys per level (the reference's `validKeys`, plus extensions marked *):
    top level:   domain, descriptors, penalty* (penaltyreader.py)
    descriptor:  key, value, rate_limit, rate_limits*, descriptors, shadow_mode, quota_mode,
                 detailed_metric, value_to_metric, share_threshold, metadata
    rate_limit:  see limitreader.py
Each level has its own list (the reference has one), so a key in the wrong place (`shadow_mode`
inside `rate_limit`, silently ignored there) is reported. As in the reference: scalars keep their
source text (`value: 200` is "200"), units are case-insensitive, a missing `requests_per_unit`
is 0, an empty `value` is none, and `*` anywhere in a value is a wildcard.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

import yaml
from yaml.nodes import Node, SequenceNode

from .boundedyaml import compose
from .limitreader import LimitReader
from .limits import DescriptorBudget
from .metadata import MetadataError, metadata_of
from .model import (
    DescriptorNode,
    Domain,
    Rule,
    RuleDefaults,
    Source,
    WildcardChild,
    wildcard_pattern,
)
from .yamlnodes import is_null, join_path, line_of, shown

# Allowed keys per level, in the order error messages list them.
ROOT_KEYS = ("domain", "descriptors", "penalty")
DESCRIPTOR_KEYS = (
    "key",
    "value",
    "rate_limit",
    "rate_limits",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
)


class _Ancestry(NamedTuple):
    path: tuple[tuple[str, str], ...] = ()  # (key, value) per level, from the root
    shared: tuple[int, ...] = ()  # levels marked share_threshold
    valued: tuple[int, ...] = ()  # levels marked value_to_metric, not share_threshold


@dataclass(slots=True)
class _Children:
    exact: dict[tuple[str, str], DescriptorNode] = field(default_factory=dict)
    wildcards: list[WildcardChild] = field(default_factory=list)
    keyed: dict[str, DescriptorNode] = field(default_factory=dict)

    def add(self, key: str, value: str, node: DescriptorNode) -> None:
        if not value:
            self.keyed[key] = node
        elif "*" in value:
            self.wildcards.append(WildcardChild(key, wildcard_pattern(value), node))
        else:
            self.exact[(key, value)] = node

    def node(self, rule: Rule) -> DescriptorNode:
        return DescriptorNode(
            rule, MappingProxyType(self.exact), tuple(self.wildcards), MappingProxyType(self.keyed)
        )


class RuleFileReader(LimitReader):
    """Helpers record a problem and return a harmless fallback, so one pass reports all it can;
    `load` returns None if this file added any. A passed bound (`LimitExceeded`) stops it."""

    def __init__(
        self, file: str, budget: DescriptorBudget, max_yaml_nodes: int, defaults: RuleDefaults
    ) -> None:
        super().__init__(file)
        self.budget = budget
        self.max_yaml_nodes = max_yaml_nodes
        self.defaults = defaults

    def load(self, data: bytes) -> Domain | None:
        try:
            root = compose(data, self.file, self.max_yaml_nodes, self.budget.pacer)
        except yaml.YAMLError as exc:
            self.syntax_problem(exc)
            return None
        if root is None:
            self.add(1, "domain", "required key is missing (the file is empty)")
            return None
        fields = self.mapping(root, "", ROOT_KEYS, " with 'domain' and 'descriptors'")
        if fields is None:
            return None
        name = self.required_text(fields, "domain", root, "")
        self.domain_penalty = self.penalty(fields.get("penalty"), "penalty")
        children = self.children(fields.get("descriptors"), "descriptors", name or "", _Ancestry())
        if name is None or self.problems:
            return None
        source = Source(self.file, line_of(fields["domain"]))
        return Domain(name, children.node(Rule(domain=name, path=(), source=source)), source)

    def children(self, node: Node | None, path: str, domain: str, parent: _Ancestry) -> _Children:
        children = _Children()
        if node is None or is_null(node):
            return children
        if not isinstance(node, SequenceNode):
            self.add(node, path, f"must be a list of descriptors (got {shown(node)})")
            return children
        seen: dict[tuple[str, str], int] = {}
        for index, item in enumerate(node.value):
            item_path = f"{path}[{index}]"
            parsed = self.descriptor(item, item_path, domain, parent)
            if parsed is None:
                continue
            key, value, child = parsed
            if (key, value) in seen:
                what = f"key '{key}' value '{value}'" if value else f"key '{key}' without value"
                line = seen[(key, value)]
                self.add(item, item_path, f"duplicate descriptor {what} (first at line {line})")
                continue
            seen[(key, value)] = line_of(item)
            children.add(key, value, child)
        return children

    def descriptor(
        self, node: Node, path: str, domain: str, parent: _Ancestry
    ) -> tuple[str, str, DescriptorNode] | None:
        self.budget.take(self.file, line_of(node), path)
        fields = self.mapping(node, path, DESCRIPTOR_KEYS, " with at least 'key'")
        if fields is None:
            return None
        key = self.required_text(fields, "key", node, path)
        value_node = fields.get("value")
        value = "" if value_node is None else self.text(value_node, join_path(path, "value"))
        limit = self.limits(fields, path)
        here, value_to_metric = self.ancestry(fields, path, parent, (key or "", value))
        children = self.children(
            fields.get("descriptors"), join_path(path, "descriptors"), domain, here
        )
        rule = Rule(
            domain=domain,
            path=here.path,
            limits=limit.limits,
            unlimited=limit.unlimited,
            shadow_mode=self.flag(fields, "shadow_mode", path),
            quota_mode=self.flag(fields, "quota_mode", path),
            metadata=self.metadata(fields.get("metadata"), join_path(path, "metadata")),
            detailed_metric=self.flag(fields, "detailed_metric", path),
            source=Source(self.file, line_of(node)),
            replaces=limit.replaces,
            value_to_metric=value_to_metric,
            shared_levels=here.shared,
            valued_levels=here.valued,
        )
        return None if key is None else (key, value, children.node(rule))

    def metadata(self, node: Node | None, key: str) -> Mapping[str, object] | None:
        if node is None or is_null(node):
            return None
        try:
            return metadata_of(node)
        except MetadataError as exc:
            self.add(node, key, str(exc))
            return None

    def ancestry(
        self, fields: dict[str, Node], path: str, parent: _Ancestry, entry: tuple[str, str]
    ) -> tuple[_Ancestry, bool]:
        """`share_threshold` beats `value_to_metric` (the reference names it by its pattern)."""
        level, valued = len(parent.path), self.flag(fields, "value_to_metric", path)
        here = parent._replace(path=(*parent.path, entry))
        if self.flag(fields, "share_threshold", path):
            if "*" not in entry[1]:
                message = "only allowed on a wildcard value (one containing '*')"
                self.add(fields["share_threshold"], join_path(path, "share_threshold"), message)
            return here._replace(shared=(*here.shared, level)), valued
        if valued:
            return here._replace(valued=(*here.valued, level)), valued
        return here, valued

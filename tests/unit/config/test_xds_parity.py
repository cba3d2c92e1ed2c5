"""One rule model whatever the source: the same random rule tree, written as a rule file and
sent as a `RateLimitConfig`, answers every request identically."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.answer import answer_now
from harness.grpc_client import request
from ratelimit_sidecar._proto.ratelimit.config.ratelimit.v3 import rls_conf_pb2 as rls
from ratelimit_sidecar.config import load_rules
from ratelimit_sidecar.config.model import RuleSet
from ratelimit_sidecar.config.xds_rules import rules_from_configs
from ratelimit_sidecar.core import LocalLimiter
from ratelimit_sidecar.service.ratelimit import RateLimitHandler

T0 = 1_700_000_040_000
KEYS = ("a", "b", "c")
VALUES = ("", "x", "y", "x*")
REQUEST_VALUES = ("x", "xa", "y", "z")
UNITS = ("SECOND", "MINUTE", "HOUR", "DAY", "WEEK", "MONTH", "YEAR")


@dataclass(frozen=True)
class Node:
    key: str
    value: str
    limit: tuple[str, int] | None  # (unit, requests_per_unit)
    unlimited: bool
    shadow: bool
    quota: bool
    children: tuple[Node, ...]


def nodes(depth: int) -> st.SearchStrategy[tuple[Node, ...]]:
    children = nodes(depth - 1) if depth > 1 else st.just(())
    node = st.builds(
        Node,
        key=st.sampled_from(KEYS),
        value=st.sampled_from(VALUES),
        limit=st.none() | st.tuples(st.sampled_from(UNITS), st.integers(0, 4)),
        unlimited=st.booleans(),
        shadow=st.booleans(),
        quota=st.booleans(),
        children=children,
    )
    # Siblings differ in (key, value): a repeated pair is refused by both readers alike.
    return st.lists(node, max_size=3, unique_by=lambda n: (n.key, n.value)).map(tuple)


def as_yaml(tree: tuple[Node, ...]) -> str:
    def descriptor(node: Node) -> dict[str, object]:
        out: dict[str, object] = {"key": node.key}
        if node.value:
            out["value"] = node.value
        if node.unlimited:
            out["rate_limit"] = {"unlimited": True}
        elif node.limit is not None:
            out["rate_limit"] = {"unit": node.limit[0].lower(), "requests_per_unit": node.limit[1]}
        if node.shadow:
            out["shadow_mode"] = True
        if node.quota:
            out["quota_mode"] = True
        if node.children:
            out["descriptors"] = [descriptor(child) for child in node.children]
        return out

    return yaml.safe_dump({"domain": "d", "descriptors": [descriptor(n) for n in tree]})


def as_proto(tree: tuple[Node, ...]) -> rls.RateLimitConfig:
    def descriptor(node: Node) -> rls.RateLimitDescriptor:
        out = rls.RateLimitDescriptor(
            key=node.key, value=node.value, shadow_mode=node.shadow, quota_mode=node.quota
        )
        if node.unlimited:
            out.rate_limit.unlimited = True
        elif node.limit is not None:
            out.rate_limit.unit = rls.RateLimitUnit.Value(node.limit[0])  # type: ignore[assignment]
            out.rate_limit.requests_per_unit = node.limit[1]
        out.descriptors.extend(descriptor(child) for child in node.children)
        return out

    return rls.RateLimitConfig(name="d", domain="d", descriptors=[descriptor(n) for n in tree])


entries = st.lists(
    st.tuples(st.sampled_from(KEYS), st.sampled_from(REQUEST_VALUES)), min_size=1, max_size=3
)
requests = st.lists(st.lists(entries, min_size=1, max_size=3), min_size=1, max_size=12)


def answers(rules: RuleSet, traffic: list[list[list[tuple[str, str]]]]) -> list[bytes]:
    clock = [T0]
    handler = RateLimitHandler(rules, LocalLimiter(), lambda: clock[0])
    replies = []
    for descriptors in traffic:
        replies.append(answer_now(handler, request("d", *descriptors).SerializeToString()))
        clock[0] += 250
    return replies


@settings(max_examples=80, deadline=None)
@given(tree=nodes(3), traffic=requests)
def test_the_same_tree_from_yaml_and_from_xds_answers_alike(
    tree: tuple[Node, ...], traffic: list[list[list[tuple[str, str]]]]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "d.yaml"
        path.write_text(as_yaml(tree))
        from_file = load_rules(path)
    from_xds = rules_from_configs([as_proto(tree)])
    assert answers(from_file, traffic) == answers(from_xds, traffic)

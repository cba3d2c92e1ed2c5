"""An RLQS bucket id (a map, without order) matched against a domain's rule tree.

At each level the entry leading to a child is taken next, until every entry is used: they then
stand in a matching descriptor's order, so the counter is the one a ShouldRateLimit gateway
sending the same entries counts under. Several entries leading somewhere are tried in key order.
"""

from __future__ import annotations

from collections.abc import Mapping

from .model import DescriptorNode, Domain, Rule

Entries = list[tuple[str, str]]
MAX_STEPS = 10_000  # tree nodes visited for one id: a tree sharing keys across levels is rare


def match_bucket(domain: Domain, bucket: Mapping[str, str]) -> tuple[Rule | None, Entries]:
    """The rule and the entries in the tree's order; no match: None and key order."""
    found = _walk(domain.root, dict(bucket), steps=[0])
    if found is None:
        return None, sorted(bucket.items())
    node, entries = found
    return node.rule, entries


def _walk(
    node: DescriptorNode, left: dict[str, str], steps: list[int]
) -> tuple[DescriptorNode, Entries] | None:
    if not left:
        return node, []
    for key in sorted(left):
        steps[0] += 1
        if steps[0] > MAX_STEPS:
            return None
        child = node.child(key, left[key])
        if child is None:
            continue
        value = left.pop(key)
        found = _walk(child, left, steps)
        left[key] = value
        if found is not None:
            return found[0], [(key, value), *found[1]]
    return None

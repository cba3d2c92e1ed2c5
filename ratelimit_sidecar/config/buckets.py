"""An RLQS bucket id (a map, without order) matched against a domain's rule tree.

At each level the entry leading to a child is taken next, until every entry is used: they then
stand in the order a matching descriptor has, so the counter key is the one a ShouldRateLimit
gateway sending the same entries counts under. Where several entries lead somewhere (levels
sharing keys), they are tried in key order, the work bounded.
"""

from __future__ import annotations

from collections.abc import Mapping

from .model import DescriptorNode, Domain, Rule

Entries = list[tuple[str, str]]
MAX_STEPS = 10_000  # tree nodes visited for one id: a tree sharing keys across levels is rare


def match_bucket(domain: Domain, bucket: Mapping[str, str]) -> tuple[Rule | None, Entries]:
    """The rule and the entries in the tree's order; no match: None and key order."""
    steps = [0]
    found = _walk(domain.root, dict(bucket), steps)
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

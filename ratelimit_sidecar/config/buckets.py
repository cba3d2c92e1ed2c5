"""An RLQS bucket id (a map of key to value) matched against a domain's rule tree.

A ShouldRateLimit descriptor is a list: its entries are walked one tree level each, in order.
A bucket id is a map, without an order, so the tree gives it one: at each level the entry whose
key (and value) leads to a child of the node reached so far is taken next, until every entry is
used. The entries then stand in the order a descriptor matching the same rule has, which makes
the counter's key (domain, key1, value1, ...) the one a ShouldRateLimit gateway sending the same
entries counts under. An id whose entries cannot all be used that way matches no rule.

Where several entries lead somewhere at one level (a tree whose levels share keys), they are
tried in key order and the first that uses every entry wins; the work is bounded.
"""

from __future__ import annotations

from collections.abc import Mapping

from .model import DescriptorNode, Domain, Rule

Entries = list[tuple[str, str]]
MAX_STEPS = 10_000  # tree nodes visited for one id: a tree sharing keys across levels is rare


def match_bucket(domain: Domain, bucket: Mapping[str, str]) -> tuple[Rule | None, Entries]:
    """The rule a bucket id ends on, and its entries in the tree's order; for an id that
    matches no rule, None and the entries in key order."""
    steps = [0]
    found = _walk(domain.root, dict(bucket), steps)
    if found is None:
        return None, sorted(bucket.items())
    node, entries = found
    return node.rule, entries


def _walk(
    node: DescriptorNode, left: dict[str, str], steps: list[int]
) -> tuple[DescriptorNode, Entries] | None:
    """The node reached by using every entry of `left` below `node`, and the order used."""
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

"""Request-path lookups: which rule a descriptor ends on, and which rules `replaces` drops.

Both follow `envoyproxy/ratelimit`: `GetLimit` in `src/config/config_impl.go` and
`constructLimitsToCheck` in `src/service/ratelimit.go`. They allocate almost nothing because they
run for every descriptor of every request.
"""

from __future__ import annotations

from collections.abc import Sequence

from .model import Domain, Rule


def match(domain: Domain, entries: Sequence[tuple[str, str]]) -> Rule | None:
    """The rule of the node reached by walking one tree level per entry, or None.

    Each level prefers an exact `key+value`, then wildcard values in file order, then the
    value-less `key` (`DescriptorNode.child`). The request must reach a node with its last entry:
    an entry that matches nothing, or entries left over below a leaf, mean no rule applies, even
    if a node on the way had a limit (the reference only takes the limit of the last level).
    The returned rule may have `limit` None (no `rate_limit`, or `unlimited`): the caller decides.
    """
    if not entries:
        return None
    node = domain.root
    for key, value in entries:
        child = node.child(key, value)  # a leaf has no children, so leftover entries end here
        if child is None:
            return None
        node = child
    return node.rule


def apply_replaces(rules: Sequence[Rule | None]) -> list[Rule | None]:
    """Drop (set to None) every matched limit whose name another matched rule `replaces`.

    `rules` are the matches of one request's descriptors, in request order; the result keeps
    that order and length so statuses still line up with descriptors. Unlimited rules may
    replace others but are never replaced themselves, and unnamed limits are never replaced,
    exactly as in the reference.
    """
    replaced: set[str] | None = None
    for rule in rules:
        if rule is not None and rule.replaces:
            if replaced is None:
                replaced = set()
            replaced.update(rule.replaces)
    if replaced is None:
        return list(rules)  # the common case: no rule of this request replaces anything
    return [
        None
        if rule is not None and rule.limit is not None and rule.limit.name in replaced
        else rule
        for rule in rules
    ]

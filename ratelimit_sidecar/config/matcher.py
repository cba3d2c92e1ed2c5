"""Request-path lookups following the reference (`GetLimit`, `constructLimitsToCheck`); they run
for every descriptor, so they allocate almost nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from .model import Domain, Rule


def match(domain: Domain, entries: Sequence[tuple[str, str]]) -> Rule | None:
    """The request must reach a node with its last entry: a miss, or entries left below a leaf,
    mean no rule, even past a node with a limit (the reference takes the last level's). The rule
    may have `limit` None."""
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
    """Drop matched limits another matched rule `replaces`, keeping order and length so statuses
    line up. As in the reference, unlimited rules and unnamed limits are never replaced."""
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

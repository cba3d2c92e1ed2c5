"""Read `penalty:` (core/penalty.py) and the durations rule files use.

    penalty: {factor: 2, max: "1h", forgive_after: "10m"}

In a `rate_limit`, or at a file's top: the default of each limit that blocks, sets no `penalty`
and has a cooldown under its `max` (`penalty: null`: off). `factor` (default 2) is in (1, 100];
`max` and `forgive_after` are required. A limit's own needs a block and `max` >= its cooldown.
"""

from __future__ import annotations

import re
from dataclasses import replace

from yaml.nodes import Node, ScalarNode

from .model import Penalty, RateLimit
from .yamlnodes import CONSTRUCTOR, TAG, NodeChecker, integer, join_path, shown

PENALTY_KEYS = ("factor", "max", "forgive_after")
DEFAULT_FACTOR = 2.0
MAX_FACTOR = 100.0
DURATION_FORMS = "a positive number of seconds, a duration like '500ms', '30s', '5m', '1h'"
_DURATION = re.compile(r"([0-9]+)(ms|s|m|h)")
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def duration_ms(node: Node) -> int | None:
    """Seconds, or '500ms', '30s', '5m', '1h'; None if neither."""
    seconds = integer(node)
    if seconds is not None:
        return seconds * 1000
    if isinstance(node, ScalarNode) and node.tag == TAG + "str":
        found = _DURATION.fullmatch(node.value)
        if found:
            return int(found[1]) * _DURATION_MS[found[2]]
    return None


class PenaltyReader(NodeChecker):
    # The rule file's top-level `penalty:`, read before its descriptors.
    domain_penalty: Penalty | None = None

    def penalty(self, node: Node | None, path: str) -> Penalty | None:
        """On its own (a limit's is then checked against the limit)."""
        fields = self.optional_mapping(node, path, PENALTY_KEYS, " like {factor: 2, max: 1h, ...}")
        if node is None or fields is None:
            return None
        before = len(self.problems)
        factor = self.factor(fields.get("factor"), join_path(path, "factor"))
        longest = self.duration(fields, "max", node, path)
        forgive = self.duration(fields, "forgive_after", node, path)
        if len(self.problems) > before:
            return None
        return Penalty(factor, longest, forgive)

    def limit_penalty(self, limit: RateLimit, fields: dict[str, Node], path: str) -> RateLimit:
        """`limit` with its own penalty, or the domain's default where it applies."""
        if "penalty" not in fields:
            default = self.domain_penalty
            applies = default is not None and 0 < limit.cooldown < default.max_ms
            return replace(limit, penalty=default) if applies else limit
        node, key = fields["penalty"], join_path(path, "penalty")
        penalty = self.penalty(node, key)
        if penalty is None:
            return limit
        if limit.cooldown <= 0:
            message = (
                "needs a block: a fixed window without cooldown: window_end, or cooldown: set"
                f" (this {limit.algorithm.text} limit never blocks)"
            )
            self.add(node, key, message)
        elif penalty.max_ms < limit.cooldown:
            message = f"max must be at least the cooldown ({limit.cooldown} ms)"
            self.add(node, join_path(key, "max"), message)
        return replace(limit, penalty=penalty)

    def factor(self, node: Node | None, key: str) -> float:
        if node is None:
            return DEFAULT_FACTOR
        value: float | None = integer(node)
        if isinstance(node, ScalarNode) and node.tag == TAG + "float":
            value = float(CONSTRUCTOR.construct_yaml_float(node))
        if value is None or not 1.0 < value <= MAX_FACTOR:
            self.add(node, key, f"must be a number above 1 and at most 100 (got {shown(node)})")
            return DEFAULT_FACTOR
        return float(value)

    def duration(self, fields: dict[str, Node], name: str, owner: Node, path: str) -> int:
        key, node = join_path(path, name), fields.get(name)
        if node is None:
            self.add(owner, key, f"required key is missing ({DURATION_FORMS})")
            return 0
        return self.positive_ms(node, key, DURATION_FORMS)

    def positive_ms(self, node: Node, key: str, forms: str) -> int:
        """A positive duration; 0 once anything else is reported as not one of `forms`."""
        milliseconds = duration_ms(node)
        if milliseconds is None or milliseconds <= 0:
            self.add(node, key, f"must be {forms} (got {shown(node)})")
            return 0
        return milliseconds

"""The `rule` label of the decision metrics, named as `envoyproxy/ratelimit` names its stats keys.

By default a descriptor is counted under its rule's id, `domain.key_value.key2` (configured values;
a wildcard level shows its pattern, a value-less level only its key). Two options add the
request's own values:

- `detailed_metric` on the rule: the id, `|`, then every request key and value;
- `value_to_metric` on a level of the rule's path (the rule's own or an ancestor's): that level
  shows `key_<request value>` instead of its configured value, unless the level also has
  `share_threshold` (all its values count together, so it keeps the pattern). An empty request
  value shows the key alone. `detailed_metric` wins over `value_to_metric`.

Request values are chosen by clients, so a rule gets at most `MAX_VALUE_LABELS` distinct
`value_to_metric` labels; later values are counted under the rule id, and each such fold-back
is counted by the overflow counter.
"""

from __future__ import annotations

from collections.abc import Callable

from ratelimit_sidecar.config.model import Rule

NS = "ratelimit_sidecar"  # every metric name starts with it

MAX_VALUE_LABELS = 100  # distinct value_to_metric labels per rule id


def value_label(rule: Rule, key: tuple[str, ...]) -> str:
    """The rule id with the request's values at the rule's `valued_levels`.

    `key` is (domain, key1, value1, key2, value2, ...): the request entries the rule matched.
    """
    parts = [rule.domain]
    for level, (name, configured) in enumerate(rule.path):
        value = key[2 + 2 * level] if level in rule.valued_levels else configured
        parts.append(f"{name}_{value}" if value else name)
    return ".".join(parts)


def detailed_label(rule: Rule, key: tuple[str, ...]) -> str:
    return rule.id + "|" + ".".join(key[1:])


class RuleLabels:
    """Names the `rule` label of each hit, bounding the values `value_to_metric` lets in."""

    def __init__(
        self, on_overflow: Callable[[str], None], max_values: int = MAX_VALUE_LABELS
    ) -> None:
        self._on_overflow, self._max_values = on_overflow, max_values
        self._values: dict[str, set[str]] = {}  # rule id -> value labels handed out

    def label(self, rule: Rule, key: tuple[str, ...]) -> str:
        if rule.detailed_metric:
            return detailed_label(rule, key)
        if not rule.valued_levels:
            return rule.id
        label = value_label(rule, key)
        seen = self._values.setdefault(rule.id, set())
        if label in seen:
            return label
        if len(seen) < self._max_values:
            seen.add(label)
            return label
        self._on_overflow(rule.id)
        return rule.id

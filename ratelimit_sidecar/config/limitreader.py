"""Read one descriptor's `rate_limit` (or `rate_limits`) mapping into `RateLimit`s.

Keys (the reference's, plus extensions marked *): unit, requests_per_unit, unlimited, name,
replaces, unit_multiplier*, spans*, cooldown* (a duration or `window_end`), algorithm*, burst*,
consistency*, on_store_failure*, penalty* (penaltyreader.py). `rate_limits*` is a list of such
mappings, all of which must admit. Combinations that cannot work are reported where written:
`burst` off a token bucket, `on_store_failure` on an eventual rule, an eventual `sliding_log`
with a shared store (a log is not a sum of span totals).
"""

from __future__ import annotations

from typing import NamedTuple

from yaml.nodes import Node, ScalarNode, SequenceNode

from .model import (
    MIN_SPAN_MS,
    AlgorithmName,
    Consistency,
    RateLimit,
    RuleDefaults,
    StoreFailure,
    Unit,
)
from .penaltyreader import DURATION_FORMS, PenaltyReader
from .yamlnodes import is_null, join_path, shown

RATE_LIMIT_KEYS = (
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "unit_multiplier",
    "spans",
    "cooldown",
    "algorithm",
    "burst",
    "consistency",
    "on_store_failure",
    "count_refused",
    "penalty",
)
REPLACES_KEYS = ("name",)
MAX_REQUESTS_PER_UNIT = 2**32 - 1  # the reference reads it into a uint32
MAX_LOG_REQUESTS = 100_000  # a sliding log keeps one time per admitted request and key
# Bound each key's spans + 1 counts and a push's span reads: an hour in seconds; a leap year.
MAX_SPANS = 3600
MAX_WINDOW_DAYS = 366
MAX_WINDOW_MS = MAX_WINDOW_DAYS * 86_400_000
UNIT_NAMES = "second, minute, hour, day, week, month, year"
ALGORITHM_NAMES = ", ".join(name.text for name in AlgorithmName)
CONSISTENCY_NAMES = ", ".join(c.value for c in Consistency)
STORE_FAILURE_NAMES = ", ".join(choice.value for choice in StoreFailure)
WINDOW_END = "window_end"  # `cooldown: window_end`
_COUNTING = tuple(key for key in RATE_LIMIT_KEYS if key not in ("unlimited", "name", "replaces"))


class ParsedLimits(NamedTuple):
    limits: tuple[RateLimit, ...]
    unlimited: bool
    replaces: tuple[str, ...]


NO_LIMITS = ParsedLimits((), False, ())


class _Counting(NamedTuple):
    algorithm: AlgorithmName
    burst: int
    strict: bool
    edge: bool
    on_store_failure: StoreFailure


class LimitReader(PenaltyReader):
    defaults: RuleDefaults

    def limits(self, fields: dict[str, Node], path: str) -> ParsedLimits:
        """`rate_limit` or `rate_limits` (never both)."""
        one, several = fields.get("rate_limit"), fields.get("rate_limits")
        if several is None or is_null(several):
            return self.rate_limit(one, join_path(path, "rate_limit"))
        if one is not None and not is_null(one):
            message = "must not be set together with rate_limit (use one or the other)"
            self.add(several, join_path(path, "rate_limits"), message)
        return self.rate_limit_list(several, join_path(path, "rate_limits"))

    def rate_limit_list(self, node: Node, path: str) -> ParsedLimits:
        if not isinstance(node, SequenceNode) or not node.value:
            self.add(node, path, f"must be a non-empty list of rate limits (got {shown(node)})")
            return NO_LIMITS
        limits: list[RateLimit] = []
        replaces: list[str] = []
        for index, item in enumerate(node.value):
            item_path = f"{path}[{index}]"
            parsed = self.rate_limit(item, item_path)
            if parsed.unlimited:
                message = "unlimited is only allowed in a single rate_limit"
                self.add(item, join_path(item_path, "unlimited"), message)
            limits.extend(parsed.limits)
            replaces.extend(parsed.replaces)
        return ParsedLimits(tuple(limits), False, tuple(replaces))

    def rate_limit(self, node: Node | None, path: str) -> ParsedLimits:
        fields = self.optional_mapping(node, path, RATE_LIMIT_KEYS, "")
        if node is None or fields is None:
            return NO_LIMITS
        before = len(self.problems)
        name = self.text(fields["name"], join_path(path, "name")) if "name" in fields else ""
        replaces = self.replaces(fields.get("replaces"), join_path(path, "replaces"), name)
        if self.flag(fields, "unlimited", path):
            return self.unlimited(fields, path, replaces)
        counting = self.counting(fields, path)
        cooldown = fields.get("cooldown")
        window_end = self.window_end(cooldown, join_path(path, "cooldown"), counting.algorithm)
        limit = RateLimit(
            requests_per_unit=self.count(
                fields, "requests_per_unit", path, minimum=0, maximum=MAX_REQUESTS_PER_UNIT
            ),
            unit=self.unit(fields, node, path),
            unit_multiplier=self.count(fields, "unit_multiplier", path, minimum=1),
            name=name,
            spans=self.count(
                fields, "spans", path, default=self.defaults.spans, minimum=2, maximum=MAX_SPANS
            ),
            cooldown_ms=0 if window_end else self.cooldown(cooldown, join_path(path, "cooldown")),
            cooldown_window_end=window_end,
            replaces=replaces,
            algorithm=counting.algorithm,
            burst=counting.burst,
            strict=counting.strict,
            edge=counting.edge,
            count_refused=self.flag(fields, "count_refused", path),
            on_store_failure=counting.on_store_failure,
            near_limit_ratio=self.defaults.near_limit_ratio,
        )
        if len(self.problems) == before:
            self.check_limit(limit, fields, node, path)
            limit = self.limit_penalty(limit, fields, path)
        return ParsedLimits((limit,), False, replaces)

    def unlimited(
        self, fields: dict[str, Node], path: str, replaces: tuple[str, ...]
    ) -> ParsedLimits:
        """Counting settings on an allow-list entry mean the author expected a limit."""
        for extra in _COUNTING:
            if extra in fields:
                self.add(
                    fields[extra], join_path(path, extra), "must not be set when unlimited is true"
                )
        return ParsedLimits((), True, replaces)

    def check_limit(self, limit: RateLimit, fields: dict[str, Node], node: Node, path: str) -> None:
        """What only the whole limit can tell: window too long, spans too short, log too long."""
        if limit.window_ms > MAX_WINDOW_MS:
            message = (
                f"window of {limit.window_ms // 86_400_000} days (unit x unit_multiplier) is"
                f" longer than {MAX_WINDOW_DAYS} days"
            )
            self.add(
                fields.get("unit_multiplier", node), join_path(path, "unit_multiplier"), message
            )
        shortest = limit.spans * MIN_SPAN_MS
        if limit.window_ms < shortest:
            message = (
                f"window of {limit.window_ms} ms is shorter than {limit.spans} spans"
                f" x {MIN_SPAN_MS} ms = {shortest} ms"
            )
            self.add(fields.get("spans", node), join_path(path, "spans"), message)
        log = limit.algorithm is AlgorithmName.SLIDING_LOG
        if log and limit.requests_per_unit > MAX_LOG_REQUESTS:
            message = (
                f"must be at most {MAX_LOG_REQUESTS} for a sliding_log, which keeps the time"
                " of every admitted request (use sliding_window for larger limits)"
            )
            self.add(fields["requests_per_unit"], join_path(path, "requests_per_unit"), message)

    def counting(self, fields: dict[str, Node], path: str) -> _Counting:
        algorithm = self.algorithm(fields.get("algorithm"), join_path(path, "algorithm"))
        burst = self.count(fields, "burst", path, minimum=1, maximum=MAX_REQUESTS_PER_UNIT)
        if "burst" in fields and algorithm is not AlgorithmName.TOKEN_BUCKET:
            message = f"only applies to algorithm token_bucket (this one is {algorithm.text})"
            self.add(fields["burst"], join_path(path, "burst"), message)
        consistency = self.consistency(fields.get("consistency"), join_path(path, "consistency"))
        strict = consistency is Consistency.STRICT
        # A sliding log is never summed in a store: it says so below, unless strict.
        edge = consistency is Consistency.EDGE and self.defaults.shared_store
        edge = edge and algorithm is not AlgorithmName.SLIDING_LOG
        failure = self.store_failure(fields.get("on_store_failure"), path, strict)
        if algorithm is AlgorithmName.SLIDING_LOG and not strict and self.defaults.shared_store:
            where = fields.get("algorithm") or fields.get("consistency")
            message = (
                "sliding_log without consistency: strict cannot be shared through Redis (a log"
                " is not a sum of span totals): add consistency: strict, or use sliding_window"
            )
            self.add(where or 0, join_path(path, "algorithm"), message)
        return _Counting(algorithm, burst if "burst" in fields else 0, strict, edge, failure)

    def algorithm(self, node: Node | None, key: str) -> AlgorithmName:
        if node is None:
            return self.defaults.algorithm
        found = AlgorithmName.parse(self.text(node, key))
        if found is None:
            self.add(node, key, f"unknown algorithm {shown(node)} (one of {ALGORITHM_NAMES})")
            return self.defaults.algorithm
        return found

    def consistency(self, node: Node | None, key: str) -> Consistency:
        if node is None:
            return self.defaults.consistency
        text = self.text(node, key).strip().lower()
        try:
            return Consistency(text)
        except ValueError:
            self.add(node, key, f"must be one of {CONSISTENCY_NAMES} (got {shown(node)})")
            return Consistency.EVENTUAL

    def store_failure(self, node: Node | None, path: str, strict: bool) -> StoreFailure:
        key = join_path(path, "on_store_failure")
        if node is None:
            return StoreFailure.LOCAL
        if not strict:
            self.add(node, key, "only applies to consistency: strict rules")
        text = self.text(node, key).strip().lower()
        try:
            return StoreFailure(text)
        except ValueError:
            self.add(node, key, f"must be one of {STORE_FAILURE_NAMES} (got {shown(node)})")
            return StoreFailure.LOCAL

    def unit(self, fields: dict[str, Node], owner: Node, path: str) -> Unit:
        key = join_path(path, "unit")
        node = fields.get("unit")
        if node is None:
            self.add(owner, key, f"required key is missing (one of {UNIT_NAMES})")
            return Unit.UNKNOWN
        text = self.text(node, key)
        unit = Unit.__members__.get(text.upper(), Unit.UNKNOWN)
        if unit is Unit.UNKNOWN and isinstance(node, ScalarNode):
            self.add(node, key, f"invalid unit '{text}' (expected one of {UNIT_NAMES})")
        return unit

    def window_end(self, node: Node | None, key: str, algorithm: AlgorithmName) -> bool:
        if not (isinstance(node, ScalarNode) and node.value == WINDOW_END):
            return False
        if algorithm is not AlgorithmName.FIXED_WINDOW:
            message = (
                f"window_end only applies to algorithm fixed_window (this one is {algorithm.text})"
            )
            self.add(node, key, message)
        return True

    def cooldown(self, node: Node | None, key: str) -> int:
        if node is None:
            return 0  # the algorithm's default
        return self.positive_ms(node, key, f"{DURATION_FORMS}, or window_end")

    def replaces(self, node: Node | None, path: str, own_name: str) -> tuple[str, ...]:
        if node is None or is_null(node):
            return ()
        if not isinstance(node, SequenceNode):
            self.add(node, path, f"must be a list of {{name: ...}} entries (got {shown(node)})")
            return ()
        names: list[str] = []
        for index, item in enumerate(node.value):
            item_path = f"{path}[{index}]"
            fields = self.mapping(item, item_path, REPLACES_KEYS, " like {name: ...}")
            name = None if fields is None else self.required_text(fields, "name", item, item_path)
            if fields is None or name is None:
                continue
            if name == own_name:
                message = "must not name its own rate limit"
                self.add(fields["name"], join_path(item_path, "name"), message)
            names.append(name)
        return tuple(names)

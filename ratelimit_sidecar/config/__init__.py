"""Rule configuration: the frozen model, its YAML loader and the request-path matcher."""

from __future__ import annotations

from .errors import ConfigError, Problem
from .loader import load_rules
from .matcher import apply_replaces, match
from .model import (
    DEFAULT_SPANS,
    MIN_SPAN_MS,
    DescriptorNode,
    Domain,
    RateLimit,
    Rule,
    RuleSet,
    Source,
    Unit,
    WildcardChild,
    wildcard_pattern,
)

__all__ = [
    "DEFAULT_SPANS",
    "MIN_SPAN_MS",
    "ConfigError",
    "DescriptorNode",
    "Domain",
    "Problem",
    "RateLimit",
    "Rule",
    "RuleSet",
    "Source",
    "Unit",
    "WildcardChild",
    "apply_replaces",
    "load_rules",
    "match",
    "wildcard_pattern",
]

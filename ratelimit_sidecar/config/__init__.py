"""Rule configuration: the frozen model, its YAML loader and the request-path matcher."""

from __future__ import annotations

from .errors import ConfigError, Problem
from .loader import load_rules
from .matcher import apply_replaces, match
from .model import MIN_SPAN_MS, DescriptorNode, Domain, Rule, RuleSet, Source, Unit

__all__ = [
    "MIN_SPAN_MS",
    "ConfigError",
    "DescriptorNode",
    "Domain",
    "Problem",
    "Rule",
    "RuleSet",
    "Source",
    "Unit",
    "apply_replaces",
    "load_rules",
    "match",
]

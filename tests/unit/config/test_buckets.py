"""RLQS bucket ids (maps) matched against a rule tree in the tree's order (config/buckets.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratelimit_sidecar.config import Domain, load_rules, match
from ratelimit_sidecar.config.buckets import match_bucket

RULES = """\
domain: shop
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100, name: per-key}
    descriptors:
      - key: path
        value: /v1/orders
        rate_limit: {unit: minute, requests_per_unit: 20, name: orders}
      - key: path
        value: "/v1/search/*"
        rate_limit: {unit: minute, requests_per_unit: 5, name: search}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 50, name: per-path}
    descriptors:
      - key: api_key
        rate_limit: {unit: second, requests_per_unit: 7, name: path-then-key}
  - key: tier
    value: internal
    rate_limit: {unlimited: true}
"""


@pytest.fixture(scope="module")
def domain(tmp_path_factory: pytest.TempPathFactory) -> Domain:
    path: Path = tmp_path_factory.mktemp("buckets") / "shop.yaml"
    path.write_text(RULES)
    found = load_rules(path).domain("shop")
    assert found is not None
    return found


def test_entries_are_put_in_the_trees_order_whatever_the_maps(domain: Domain) -> None:
    rule, entries = match_bucket(domain, {"path": "/v1/orders", "api_key": "k1"})
    assert entries == [("api_key", "k1"), ("path", "/v1/orders")]
    assert rule is not None and rule.limit is not None and rule.limit.name == "orders"
    assert rule is match(domain, entries)  # the rule a ShouldRateLimit descriptor ends on


def test_a_wildcard_level_matches_as_a_descriptor_does(domain: Domain) -> None:
    rule, entries = match_bucket(domain, {"api_key": "k1", "path": "/v1/search/books"})
    assert rule is not None and rule.limit is not None and rule.limit.name == "search"
    assert entries == [("api_key", "k1"), ("path", "/v1/search/books")]


def test_keys_at_several_levels_take_the_first_order_that_uses_every_entry(
    domain: Domain,
) -> None:
    """api_key -> path has no child for /v1/other, path -> api_key does: that order wins."""
    rule, entries = match_bucket(domain, {"api_key": "k1", "path": "/v1/other"})
    assert entries == [("path", "/v1/other"), ("api_key", "k1")]
    assert rule is not None and rule.limit is not None and rule.limit.name == "path-then-key"


def test_one_entry_and_an_unlimited_rule(domain: Domain) -> None:
    rule, _ = match_bucket(domain, {"api_key": "k1"})
    assert rule is not None and rule.limit is not None and rule.limit.name == "per-key"
    rule, _ = match_bucket(domain, {"tier": "internal"})
    assert rule is not None and rule.unlimited


@pytest.mark.parametrize(
    "bucket",
    [
        {"user": "u1"},  # a key the tree does not have
        {"api_key": "k1", "rule": "by_scenario"},  # an entry left over: no rule, as a descriptor
        {"tier": "external"},
    ],
)
def test_an_id_that_cannot_use_every_entry_matches_no_rule(
    domain: Domain, bucket: dict[str, str]
) -> None:
    rule, entries = match_bucket(domain, bucket)
    assert rule is None
    assert entries == sorted(bucket.items())

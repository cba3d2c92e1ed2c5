from __future__ import annotations

from pathlib import Path

import pytest

from ratelimit_sidecar.config import (
    DescriptorNode,
    Domain,
    Rule,
    Source,
    apply_replaces,
    load_rules,
    match,
)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def domain() -> Domain:
    found = load_rules(FIXTURES / "matching.yaml").domain("match")
    assert found is not None
    return found


def _name(rule: Rule | None) -> str | None:
    """The limit name a match ends on; None when nothing matched."""
    if rule is None:
        return None
    return rule.limit.name if rule.limit is not None else "<no limit>"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("10.9.0.1", "ip-exact"),  # exact beats both wildcards and the value-less key
        ("10.9.5.5", "ip-prefix"),  # both wildcards match: the first in file order wins
        ("10.1.1.1", "ip-broad"),
        ("192.168.0.1", "ip-any"),  # value-less key comes last
    ],
)
def test_precedence_exact_then_wildcards_in_order_then_value_less(
    domain: Domain, value: str, expected: str
) -> None:
    assert _name(match(domain, [("ip", value)])) == expected


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("ip", "10.9.", "ip-prefix"),  # `*` may match nothing
        ("host", "api.example.com", "host-suffix"),
        ("host", "a.b.example.com", "host-suffix"),
        ("host", "example.com", None),  # the dot before the suffix is required
        ("host", "api.example.com.evil", None),  # the whole value must match
        ("host", "apiXexample.com", None),  # `.` in a pattern is literal
        ("code", "az", "code-infix"),
        ("code", "a-b-c-z", "code-infix"),
        ("code", "a-b-c", None),
        ("code", "za", None),
    ],
)
def test_wildcard_prefix_suffix_infix(
    domain: Domain, key: str, value: str, expected: str | None
) -> None:
    assert _name(match(domain, [(key, value)])) == expected


def test_nested_descriptors(domain: Domain) -> None:
    tenant = ("tenant", "acme")

    assert _name(match(domain, [tenant, ("user", "bob")])) == "acme-user"
    admin = match(domain, [tenant, ("user", "bob"), ("path", "/admin")])
    assert admin is not None
    assert admin.limit is not None
    assert admin.limit.requests_per_unit == 8
    root_user = match(domain, [tenant, ("user", "root")])
    assert root_user is not None
    assert (root_user.unlimited, root_user.limit) == (True, None)


def test_last_entry_decides_even_without_a_limit(domain: Domain) -> None:
    # The tenant node has no rate_limit: the caller gets its rule and sees limit None.
    rule = match(domain, [("tenant", "acme")])

    assert rule is not None
    assert rule.path == (("tenant", "acme"),)
    assert rule.limit is None


@pytest.mark.parametrize(
    "entries",
    [
        [("ip", "10.9.0.1"), ("extra", "x")],  # entries left below a leaf, even one with a limit
        [("tenant", "acme"), ("user", "bob"), ("path", "/other")],  # third level has no match
        [("tenant", "acme"), ("user", "bob"), ("path", "/admin"), ("more", "x")],
        [("user", "bob"), ("tenant", "acme")],  # order matters: one level per entry
        [("nope", "x")],
        [("tenant", "other")],
        [],
    ],
)
def test_no_rule_when_the_request_does_not_end_on_a_node(
    domain: Domain, entries: list[tuple[str, str]]
) -> None:
    assert match(domain, entries) is None


def test_empty_domain_matches_nothing() -> None:
    empty = Domain("empty", DescriptorNode(Rule("empty", ())), Source("x.yaml", 1))

    assert match(empty, [("a", "b")]) is None


def test_replaces_drops_the_named_limit_and_keeps_order(domain: Domain) -> None:
    matched = [match(domain, [("global", "x")]), None, match(domain, [("route", "/search")])]

    result = apply_replaces(matched)

    assert result == [None, None, matched[2]]
    assert _name(result[2]) == "search"


def test_unlimited_rules_replace_but_are_never_replaced(domain: Domain) -> None:
    root_user = match(domain, [("tenant", "acme"), ("user", "root")])
    matched = [match(domain, [("global", "x")]), root_user]

    assert apply_replaces(matched) == [None, root_user]


def test_nothing_replaced_without_replaces(domain: Domain) -> None:
    matched = [match(domain, [("ip", "1.2.3.4")]), match(domain, [("global", "x")]), None]

    result = apply_replaces(matched)

    assert result == matched
    assert result is not matched  # callers may mutate their copy


def test_unnamed_limits_are_never_replaced(domain: Domain) -> None:
    admin = match(domain, [("tenant", "acme"), ("user", "bob"), ("path", "/admin")])
    search = match(domain, [("route", "/search")])

    assert apply_replaces([admin, search]) == [admin, search]

"""Rule keys of the reference service this product once refused: `metadata`, `quota_mode`, and
this product's `cooldown: window_end` (a block that ends with its window, as in the reference)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratelimit_sidecar.config import ConfigError, Domain, load_rules

PARITY = Path(__file__).parent / "fixtures" / "parity"


def _billing() -> Domain:
    domain = load_rules(PARITY / "metadata_quota.yaml").domain("billing")
    assert domain is not None
    return domain


def test_metadata_is_kept_on_its_descriptor_as_struct_values() -> None:
    root = _billing().root

    plan = root.exact[("tenant", "acme")].keyed["plan"].rule
    project = root.keyed["project"].rule

    assert plan.metadata == {"owner": "team-payments"}
    assert project.metadata == {
        "quota": {"bucket": "projects", "tiers": ["free", "paid"], "weight": 2.5, "shared": True},
        "1": "numeric key",  # a Struct's keys are strings
    }
    assert root.exact[("tenant", "acme")].exact[("plan", "gold")].rule.metadata is None


def test_quota_mode_is_a_descriptor_flag() -> None:
    root = _billing().root

    assert root.keyed["project"].rule.quota_mode is True
    assert root.exact[("export", "csv")].rule.quota_mode is True
    assert root.exact[("tenant", "acme")].keyed["plan"].rule.quota_mode is False


def test_cooldown_window_end_sets_its_own_field_not_a_duration() -> None:
    root = _billing().root

    export = root.exact[("export", "csv")].rule.limit
    plan = root.exact[("tenant", "acme")].keyed["plan"].rule.limit
    assert export is not None and plan is not None
    assert (export.cooldown_window_end, export.cooldown_ms, export.cooldown) == (True, 0, 0)
    assert (plan.cooldown_window_end, plan.cooldown) == (False, 1000)  # one window, as before


def test_bad_metadata_and_misplaced_window_end_are_reported() -> None:
    path = PARITY / "bad_metadata.yaml"

    with pytest.raises(ConfigError) as caught:
        load_rules(path)

    assert [(p.line, p.key) for p in caught.value.problems] == [
        (4, "descriptors[0].metadata"),
        (7, "descriptors[1].metadata"),
        (13, "descriptors[2].rate_limit.cooldown"),
    ]
    messages = [p.message for p in caught.value.problems]
    assert messages[0] == "must be a mapping"
    assert "date or time" in messages[1]
    assert messages[2].startswith("window_end only applies to algorithm fixed_window")

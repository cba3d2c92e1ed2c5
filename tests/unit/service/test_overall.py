"""The overall code under quota mode, decided as the reference decides it."""

from __future__ import annotations

from ratelimit_sidecar.config.model import RateLimit, Rule, Unit
from ratelimit_sidecar.core import Code, Hit, Verdict
from ratelimit_sidecar.service.overall import refuses

LIMIT = RateLimit(1, Unit.MINUTE)
REGULAR = Rule("d", (("r", ""),), LIMIT)
QUOTA = Rule("d", (("q", ""),), LIMIT, quota_mode=True)
UNLIMITED = Rule("d", (("u", ""),), unlimited=True)
OK, OVER = Verdict(Code.OK, LIMIT), Verdict(Code.OVER_LIMIT, LIMIT)


def _refuses(*pairs: tuple[Rule | None, Verdict], everywhere: bool = False) -> bool:
    hits = [Hit(rule, ("d",), 1) for rule, _ in pairs]
    return refuses(hits, [verdict for _, verdict in pairs], everywhere)


def test_quota_descriptors_refuse_only_together() -> None:
    assert not _refuses((QUOTA, OVER), (QUOTA, OK))
    assert _refuses((QUOTA, OVER), (QUOTA, OVER))
    assert _refuses((REGULAR, OVER), (QUOTA, OK))  # a regular limit over refuses anyway
    assert _refuses((REGULAR, OK), (QUOTA, OVER))  # the only quota descriptor is over


def test_unlimited_descriptors_are_never_quota_descriptors() -> None:
    assert _refuses((QUOTA, OVER), (UNLIMITED, Verdict(Code.OK, unlimited=True)), everywhere=True)


def test_global_quota_mode_counts_unmatched_descriptors_as_passing_quotas() -> None:
    # as in the reference: with quota mode for every descriptor, an unmatched one passes
    assert not _refuses((REGULAR, OVER), (None, Verdict(Code.OK)), everywhere=True)
    assert _refuses((REGULAR, OVER), everywhere=True)

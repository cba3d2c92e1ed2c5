"""The RLQS servicer's semantics (service/quota.py) feed a report's allowed and denied counts to
the bucket's pace (core/quota_usage.py `BucketQuota`), which sizes what a bucket may grow to."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.config.model import RuleDefaults
from ratelimit_sidecar.core import FleetLimiter, LocalLimiter
from ratelimit_sidecar.core.quota_assign import Action, QuotaPolicy
from ratelimit_sidecar.service import quota as quota_module
from ratelimit_sidecar.service.quota import QuotaService, QuotaStream, Usage
from ratelimit_sidecar.service.validation import InvalidRequest

T0 = 1_700_000_040_000


def test_a_reports_allowed_and_denied_requests_are_the_buckets_pace(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    limit = "{unit: minute, requests_per_unit: 240}"
    path.write_text(f"domain: d\ndescriptors:\n  - key: user\n    rate_limit: {limit}\n")
    rules = load_rules(path)
    now = [T0 + 100]
    stream = QuotaService(lambda: rules, LocalLimiter(), lambda: now[0]).open_stream()
    first = stream.report("d", [Usage({"user": "a"}, 1, 0)])
    assert [action.bucket for action in first] == [(("user", "a"),)]
    now[0] += 5000
    stream.report("d", [Usage({"user": "a"}, 10, 30)])
    quota = stream._buckets[(("user", "a"),)].quota
    assert quota.rate == 40 / 5000  # requests offered per ms, allowed or not


def _stream(tmp_path: Path) -> QuotaStream:
    path = tmp_path / "d.yaml"
    limit = "{unit: minute, requests_per_unit: 240}"
    path.write_text(f"domain: d\ndescriptors:\n  - key: user\n    rate_limit: {limit}\n")
    rules = load_rules(path)
    return QuotaService(lambda: rules, LocalLimiter(), lambda: T0).open_stream()


def test_one_report_cannot_take_a_stream_past_its_bucket_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quota_module, "MAX_BUCKETS_PER_STREAM", 5)
    stream = _stream(tmp_path)
    stream.report("d", [Usage({"user": str(n)}, 1, 0) for n in range(3)])
    too_many = [Usage({"user": str(n)}, 1, 0) for n in range(10)]  # 7 new: 3 + 7 > 5

    with pytest.raises(InvalidRequest, match="more than 5 buckets"):
        stream.report("d", too_many)

    assert len(stream._buckets) == 3  # nothing of the refused report was counted
    again = [Usage({"user": str(n)}, 1, 0) for n in (0, 1, 2, 2, 3, 4)]  # 2 new: 5 in all
    stream.report("d", again)
    assert len(stream._buckets) == 5


def test_a_lease_abandoned_at_its_windows_end_keeps_its_pace_then_is_forgotten(
    tmp_path: Path,
) -> None:
    """Abandoned at the window's end (leases), a bucket stays tracked with its pace for the
    request that makes it anew; not made anew by its recheck (a minute), it is forgotten."""
    path = tmp_path / "d.yaml"
    limit = "{unit: minute, requests_per_unit: 240, consistency: strict}"
    path.write_text(f"domain: d\ndescriptors:\n  - key: user\n    rate_limit: {limit}\n")
    rules = load_rules(path, defaults=RuleDefaults(shared_store=True))
    now, limiter = [T0 + 13_000], FleetLimiter()
    service = QuotaService(lambda: rules, limiter, lambda: now[0])
    stream, bucket = service.open_stream(), (("user", "a"),)
    stream.report("d", [Usage({"user": "a"}, 1, 0)])
    now[0] = T0 + 60_000  # the window's reset
    due = stream.due()
    assert [(a.bucket, a.assignment.action) for a in due] == [(bucket, Action.ABANDON)]
    assert bucket in stream._buckets and len(service.holders) == 1
    now[0] = T0 + 60_000 + QuotaPolicy().forget_ms
    assert stream.due() == []
    assert bucket not in stream._buckets and not service.holders


def test_an_idle_bucket_is_abandoned_and_forgotten(tmp_path: Path) -> None:
    """Idle for a minute of reports: abandoned, and forgotten by the stream at once."""
    path = tmp_path / "d.yaml"
    limit = "{unit: day, requests_per_unit: 2000, consistency: edge}"
    path.write_text(f"domain: d\ndescriptors:\n  - key: user\n    rate_limit: {limit}\n")
    rules = load_rules(path, defaults=RuleDefaults(shared_store=True))
    now, limiter, policy = [T0 + 1000], FleetLimiter(), QuotaPolicy()
    service = QuotaService(lambda: rules, limiter, lambda: now[0], policy=policy)
    stream, bucket = service.open_stream(), (("user", "a"),)
    for allowed in [1, 5, 5] + [0] * (policy.abandon_after_reports - 1):
        stream.report("d", [Usage({"user": "a"}, allowed, 0)])
        now[0] += policy.report_interval_ms
    assert bucket in stream._buckets
    last = stream.report("d", [Usage({"user": "a"}, 0, 0)])
    assert [(a.bucket, a.assignment.action) for a in last] == [(bucket, Action.ABANDON)]
    assert bucket not in stream._buckets and not service.holders


class Dropped:
    """A QuotaObserver that counts only the deny-list buckets abandoned."""

    def __init__(self) -> None:
        self.deny_list = 0

    def reported(self, allowed: int, denied: int) -> None:
        pass

    def assigned(self, action: str) -> None:
        pass

    def streams(self, delta: int) -> None:
        pass

    def deny_list_abandoned(self) -> None:
        self.deny_list += 1


def test_an_idle_deny_list_bucket_is_kept_while_its_stream_has_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Abandoned, a banned client's next request passes by Envoy's no-assignment fallback (one a
    minute passed every time): kept, its DENY_ALL refreshed. Past KEEP_DENIED_UNDER buckets on
    the stream it goes as any idle bucket, counted (`rlqs_deny_list_abandoned_total`)."""
    path = tmp_path / "d.yaml"
    deny_list = "{unit: second, requests_per_unit: 0}"
    path.write_text(f"domain: d\ndescriptors:\n  - key: user\n    rate_limit: {deny_list}\n")
    rules = load_rules(path, defaults=RuleDefaults(shared_store=True))
    now, policy, observer = [T0], QuotaPolicy(), Dropped()
    service = QuotaService(lambda: rules, FleetLimiter(), lambda: now[0], observer=observer)
    stream = service.open_stream()
    users = [Usage({"user": "a"}, 1, 0), Usage({"user": "b"}, 1, 0)]
    stream.report("d", users)
    idle = [Usage(u.bucket, 0, 0) for u in users]
    for _ in range(2 * policy.abandon_after_reports):
        now[0] += policy.report_interval_ms
        actions = stream.report("d", idle)
        assert all(a.assignment.action is Action.DENY_ALL for a in actions), actions
    assert len(stream._buckets) == 2 and observer.deny_list == 0
    monkeypatch.setattr(quota_module, "KEEP_DENIED_UNDER", 2)  # two buckets: no room
    actions = stream.report("d", idle)  # the first goes; then there is room for the second
    assert [(a.bucket, a.assignment.action) for a in actions] == [
        ((("user", "a"),), Action.ABANDON)
    ]
    assert list(stream._buckets) == [(("user", "b"),)] and observer.deny_list == 1

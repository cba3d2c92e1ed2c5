"""The RLQS servicer's semantics (service/quota.py) feed a report's allowed and denied counts to
the bucket's pace (core/quota_usage.py `BucketQuota`), which sizes what a bucket may grow to."""

from __future__ import annotations

from pathlib import Path

from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.core import LocalLimiter
from ratelimit_sidecar.service.quota import QuotaService, Usage

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

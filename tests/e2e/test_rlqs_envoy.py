"""Envoy 1.40.0's `rate_limit_quota` filter as it really behaves, against a scripted RLQS server.

Each test pins one thing the sidecar relies on or works around, most of them departures from
the API documentation (docs/RLQS-ENVOY.md), so that an Envoy release that changes it fails
here. Envoy reports only every 5 s, so one timeline (the `observed` fixture, ~12 s) drives five
Envoys and many buckets at once, and each test asserts on its part of what was recorded.

  plain     reporting_interval 1 s, no expired_assignment_behavior: most buckets
  slow      reporting_interval 12 s, no no_assignment_behavior
  reuse     expired_assignment_behavior: reuse_last_assignment
  fallback  expired_assignment_behavior: fallback_rate_limit DENY_ALL (the control for `reuse`);
            then its stream is ended by the server
  outage    its own RLQS server, stopped for 6 s and started again
"""

from __future__ import annotations

import itertools
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.rlqs_envoy import RlqsEnvoy
from harness.rlqs_server import (
    Report,
    ScriptedRlqsServer,
    Strategy,
    Usage,
    action,
    assignment,
    blanket,
    bucket_key,
    token_bucket,
)

pytestmark = pytest.mark.e2e

REPORT_PERIOD_S = 5.0  # Envoy 1.40's fixed report timer
OUTAGE_S = 6.0  # longer than one report period: at least one report cannot be sent
TTL_S = 60.0

# bucket name -> the assignment every report of it gets (on the `plain` Envoy)
PLAIN_ANSWERS = {
    "deny-no-ttl": assignment(blanket("DENY_ALL"), None),
    "deny-ttl": assignment(blanket("DENY_ALL"), TTL_S),
    "per-minute": assignment(
        Strategy(
            requests_per_time_unit=Strategy.RequestsPerTimeUnit(
                requests_per_time_unit=1, time_unit="MINUTE"
            )
        ),
        TTL_S,
    ),
    "bucket-no-fill": assignment(token_bucket(2, 1.0), TTL_S),
    "bucket-fill": assignment(token_bucket(2, 1.0, tokens_per_fill=1), TTL_S),
    "bucket-fast": assignment(token_bucket(1, 0.5, tokens_per_fill=1), TTL_S),
    "bucket-continuous": assignment(token_bucket(4, 4.0, tokens_per_fill=4), TTL_S),
}


def _per_minute_bucket(max_tokens: int) -> object:
    return assignment(token_bucket(max_tokens, 60.0, tokens_per_fill=1), TTL_S)


# Token buckets sent again at a later timer report: name -> (first, then, requests spent first)
RESENT = {
    "bucket-same": (_per_minute_bucket(2), _per_minute_bucket(2), 3),
    "bucket-grow": (_per_minute_bucket(10), _per_minute_bucket(20), 5),
    "bucket-shrink": (_per_minute_bucket(10), _per_minute_bucket(3), 0),
    # 2 of 10 left, then the same bucket behind a DENY_ALL, in one response
    "bucket-reset": (
        _per_minute_bucket(10),
        [assignment(blanket("DENY_ALL"), TTL_S), _per_minute_bucket(10)],
        8,
    ),
}
PLAIN_SILENT = ("first", "idle", "abandon-me")  # never assigned anything
SHORT_DENY = assignment(blanket("DENY_ALL"), 1.0)  # `reuse` and `fallback`: answered once


def status(url: str, bucket: str) -> int:
    request = urllib.request.Request(url, headers={"x-bucket": bucket})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return error.code


def name_of(usage: Usage) -> str:
    return dict(usage.bucket)["name"]


def is_periodic(report: Report) -> bool:
    """A timer report, not the one a bucket's first request sends at once (elapsed 0)."""
    return not report.usages or any(u.elapsed_s > 0 for u in report.usages)


@dataclass
class Observed:
    """What the timeline did and what the servers recorded."""

    envoys: dict[str, RlqsEnvoy]
    server: ScriptedRlqsServer
    outage_server: ScriptedRlqsServer
    first_report_delay_s: float = 0.0
    burst: dict[str, list[int]] = field(default_factory=dict)  # just after assignment
    later: dict[str, list[int]] = field(default_factory=dict)  # 2.5 s later
    resent: dict[str, list[int]] = field(default_factory=dict)  # after the next timer report
    changed_at: float = 0.0
    resubscribed_at: float = 0.0
    slow_first: list[int] = field(default_factory=list)  # without no_assignment_behavior
    ended_at: float = 0.0  # the server ended the `fallback` stream (OK)
    after_end: int = 0  # a new bucket's first request then
    resubscribe_delay_s: float = 0.0  # an abandoned bucket's next request to its report
    abandoned_at: float = 0.0
    before_abandon: list[int] = field(default_factory=list)  # admitted just before the abandon
    outage_allowed: dict[str, int] = field(default_factory=dict)
    restarted_at: float = 0.0
    stats: dict[str, int] = field(default_factory=dict)

    def reports(self, domain: str) -> list[Report]:
        return [r for r in self.server.reports if r.domain == domain]

    def periodic(self, domain: str) -> list[Report]:
        return [r for r in self.reports(domain) if is_periodic(r)]

    def usages(self, name: str, server: ScriptedRlqsServer | None = None) -> list[Usage]:
        return [u for _, u in (server or self.server).usages({"name": name})]


def _statuses(url: str, names: Mapping[str, int]) -> dict[str, list[int]]:
    return {name: [status(url, name) for _ in range(count)] for name, count in names.items()}


def _first_requests(seen: Observed) -> None:
    """Every bucket's first request; waits until each has been reported."""
    plain, server = seen.envoys["plain"], seen.server
    start = time.monotonic()
    assert status(plain.url, "first") == 200
    server.wait_for(lambda s: bool(s.usages({"name": "first"})), 2.0, "first report")
    seen.first_report_delay_s = server.usages({"name": "first"})[0][0].at - start
    for name in (*PLAIN_SILENT[1:], *PLAIN_ANSWERS, *RESENT):
        assert status(plain.url, name) == 200  # no assignment yet: ALLOW_ALL
    seen.slow_first = [status(seen.envoys["slow"].url, "slow") for _ in range(3)]
    for domain in ("reuse", "fallback", "outage"):
        assert status(seen.envoys[domain].url, domain) == 200
    names = [*PLAIN_SILENT, *PLAIN_ANSWERS, *RESENT, "slow", "reuse", "fallback"]
    server.wait_for(lambda s: all(s.usages({"name": n}) for n in names), 3.0, "first reports")
    assert status(seen.envoys["outage"].url, "held") == 200
    seen.outage_server.wait_for(
        lambda s: all(s.usages({"name": n}) for n in ("outage", "held")), 3.0, "outage reports"
    )
    _wait_status(seen.envoys["outage"].url, "held", 429)
    for domain in ("reuse", "fallback"):
        server.answer({"name": domain}, None)  # answered once: the 1 s TTL then runs out


def _wait_status(url: str, bucket: str, expected: int, timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while status(url, bucket) != expected:
        assert time.monotonic() < deadline, f"{bucket} never answered {expected}"
        time.sleep(0.05)


def _bursts(seen: Observed) -> None:
    plain = seen.envoys["plain"]
    seen.burst |= _statuses(plain.url, dict.fromkeys(PLAIN_ANSWERS, 5))
    seen.burst |= _statuses(plain.url, {name: spend for name, (_, _, spend) in RESENT.items()})
    for name, (_, then, _) in RESENT.items():
        seen.server.answer({"name": name}, then)
    seen.changed_at = time.monotonic()
    for domain in ("reuse", "fallback"):
        seen.burst |= _statuses(seen.envoys[domain].url, {domain: 3})
    time.sleep(2.5)  # past the 1 s TTLs and two 1 s fill intervals
    seen.later = _statuses(plain.url, dict.fromkeys(PLAIN_ANSWERS, 3))
    for domain in ("reuse", "fallback"):
        seen.later |= _statuses(seen.envoys[domain].url, {domain: 3})
    _end_a_stream(seen)


def _end_a_stream(seen: Observed) -> None:
    """The server ends `fallback`'s stream, then a new bucket's first request arrives."""
    seen.ended_at = time.monotonic()
    assert seen.server.end_streams("fallback") == 1
    time.sleep(0.2)
    seen.after_end = status(seen.envoys["fallback"].url, "fallback-new")


def _resent(seen: Observed) -> None:
    """Requests once the next timer report has been answered (the same, or bigger, buckets)."""
    seen.server.wait_for(
        lambda s: any(r.at > seen.changed_at for r in seen.periodic("plain")),
        REPORT_PERIOD_S + 2,
        "a timer report after the change",
    )
    time.sleep(0.2)  # its answer applied
    names = {"bucket-same": 3, "bucket-grow": 12, "bucket-shrink": 5, "bucket-reset": 12}
    seen.resent = _statuses(seen.envoys["plain"].url, names)


def _resubscribe(seen: Observed) -> None:
    """A request to the abandoned bucket: reported at once, as a new bucket is."""
    start = seen.resubscribed_at = time.monotonic()
    assert status(seen.envoys["plain"].url, "abandon-me") == 200

    def reported(server: ScriptedRlqsServer) -> bool:
        return any(r.at > start for r, _ in server.usages({"name": "abandon-me"}))

    seen.server.wait_for(reported, 2.0, "abandon-me reported again")
    again = [r for r, _ in seen.server.usages({"name": "abandon-me"}) if r.at > start]
    seen.resubscribe_delay_s = again[0].at - start


def _outage(seen: Observed) -> None:
    """The outage server goes away while requests flow, and comes back after a report."""
    outage, url = seen.outage_server, seen.envoys["outage"].url
    outage.stop()
    gone = time.monotonic()
    seen.outage_allowed = {
        name: [status(url, name) for _ in range(count)].count(200)
        for name, count in (("outage", 5), ("offline", 7))
    }
    seen.burst["held"] = [status(url, "held") for _ in range(3)]
    _bursts(seen)
    seen.server.wait_for(
        lambda s: any(u.elapsed_s > 0 for _, u in s.usages({"name": "abandon-me"})),
        REPORT_PERIOD_S + 2,
        "a timer report of abandon-me",
    )
    # admitted since that report, then abandoned: never reported (a lease counts on it)
    seen.before_abandon = [status(seen.envoys["plain"].url, "abandon-me") for _ in range(2)]
    # to every stream: `reuse` is all its Envoy has; the others know neither bucket
    abandon = [action(bucket_key({"name": n}), abandon=True) for n in ("abandon-me", "reuse")]
    seen.server.push(*abandon)
    seen.abandoned_at = time.monotonic()
    _resent(seen)
    time.sleep(max(0.0, gone + OUTAGE_S - time.monotonic()))
    outage.answer({"name": "held"}, None)
    outage.start()
    seen.restarted_at = time.monotonic()
    assert [status(url, "outage") for _ in range(2)] == [200, 200]


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    workdir: Path = tmp_path_factory.mktemp("rlqs-envoy")
    server, outage_server = ScriptedRlqsServer().start(), ScriptedRlqsServer().start()
    outage_server.answer({"name": "held"}, assignment(blanket("DENY_ALL"), TTL_S))
    for name, quota in PLAIN_ANSWERS.items():
        server.answer({"name": name}, quota)
    for name, (first, _, _) in RESENT.items():
        server.answer({"name": name}, first)
    for domain in ("reuse", "fallback"):
        server.answer({"name": domain}, SHORT_DENY)
    expired = {
        "reuse": {"expired_assignment_behavior_timeout": "60s", "reuse_last_assignment": {}},
        "fallback": {
            "expired_assignment_behavior_timeout": "60s",
            "fallback_rate_limit": {"blanket_rule": "DENY_ALL"},
        },
    }
    envoys: dict[str, RlqsEnvoy] = {}
    try:
        for domain in ("plain", "slow", "reuse", "fallback", "outage"):
            envoys[domain] = RlqsEnvoy(
                workdir,
                outage_server.port if domain == "outage" else server.port,
                domain,
                domain=domain,
                reporting_interval_s=12 if domain == "slow" else 1,
                no_assignment=None if domain == "slow" else "ALLOW_ALL",
                expired=expired.get(domain),
            )
        for envoy in envoys.values():
            envoy.wait_ready()
        seen = Observed(envoys, server, outage_server)
        _first_requests(seen)
        _outage(seen)
        server.wait_for(
            lambda s: len(seen.periodic("plain")) >= 2 and len(seen.periodic("slow")) >= 2,
            2 * REPORT_PERIOD_S + 2,
            "two timer reports from each Envoy",
        )
        server.wait_for(
            lambda s: any(r.at > seen.abandoned_at + 0.2 for r in seen.reports("reuse")),
            REPORT_PERIOD_S + 2,
            "a report after the abandon",
        )
        server.wait_for(
            lambda s: any(
                r.stream != seen.reports("fallback")[0].stream for r in seen.reports("fallback")
            ),
            REPORT_PERIOD_S + 2,
            "fallback's stream reopened",
        )
        outage_server.wait_for(
            lambda s: any(r.stream > 0 for r in s.reports), REPORT_PERIOD_S + 2, "reconnect"
        )
        _resubscribe(seen)
        seen.stats = envoys["plain"].stats("")
        yield seen
    finally:
        for envoy in envoys.values():
            envoy.stop()
        server.stop()
        outage_server.stop()


# --- reporting ------------------------------------------------------------------------------


def test_reports_every_5s_whatever_reporting_interval_says(observed: Observed) -> None:
    for domain in ("plain", "slow"):  # reporting_interval 1 s and 12 s
        times = [r.at for r in observed.periodic(domain)]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert gaps, domain
        assert all(abs(gap - REPORT_PERIOD_S) < 0.5 for gap in gaps), (domain, gaps)


def test_first_request_of_a_new_bucket_is_reported_at_once(observed: Observed) -> None:
    assert observed.first_report_delay_s < 0.5
    [first, *_] = observed.usages("first")
    assert (first.allowed, first.denied) == (1, 0)


def test_time_elapsed_is_whole_seconds_and_zero_on_the_first_report(observed: Observed) -> None:
    for name in ("first", "idle", "slow"):
        elapsed = [u.elapsed_s for u in observed.usages(name)]
        assert elapsed[0] == 0, (name, elapsed)
        # measured 4 or 5 for a 5 s period: whole seconds, rounded down
        assert all(e in (4.0, 5.0) for e in elapsed[1:]), (name, elapsed)
        assert len(elapsed) >= 3, (name, elapsed)


def test_idle_bucket_is_reported_as_zero_until_abandoned(observed: Observed) -> None:
    idle = observed.usages("idle")[1:]
    assert len(idle) >= 2 and all((u.allowed, u.denied) == (0, 0) for u in idle), idle
    after = [
        r
        for r in observed.reports("plain")
        if r.at > observed.abandoned_at + 0.2 and any(name_of(u) == "idle" for u in r.usages)
    ]
    assert after, "no timer report after the abandon"
    assert all("abandon-me" not in {name_of(u) for u in r.usages} for r in after)


def test_an_assignment_triggers_no_report(observed: Observed) -> None:
    # the API says a bucket's usage is reported when an assignment arrives; 1.40 waits
    at_once = [
        r
        for r in observed.reports("plain")
        if not is_periodic(r) and r.at < observed.resubscribed_at  # that one is a new bucket
    ]
    assert all(len(r.usages) == 1 for r in at_once), at_once
    names = sorted(name_of(r.usages[0]) for r in at_once)
    assert names == sorted([*PLAIN_SILENT, *PLAIN_ANSWERS, *RESENT])  # each its first request


def test_an_abandoned_bucket_starts_over_with_an_immediate_report(observed: Observed) -> None:
    assert observed.resubscribe_delay_s < 0.5
    last = observed.usages("abandon-me")[-1]
    assert (last.elapsed_s, last.allowed, last.denied) == (0.0, 1, 0)


def test_an_abandoned_bucket_drops_what_it_admitted_since_its_last_report(
    observed: Observed,
) -> None:
    """Two requests admitted after its last timer report, then abandoned: no report carries
    them, only its first request and the one that made it anew."""
    assert observed.before_abandon == [200, 200]
    assert [u.allowed for u in observed.usages("abandon-me") if u.allowed] == [1, 1]


def test_abandoning_every_bucket_leaves_empty_reports(observed: Observed) -> None:
    after = [r for r in observed.reports("reuse") if r.at > observed.abandoned_at + 0.2]
    assert after and all(r.usages == () for r in after), after


def test_actions_for_buckets_a_stream_never_reported_are_dropped(observed: Observed) -> None:
    # `slow` got the abandon of `abandon-me` and `reuse`, which it never had
    log = observed.envoys["slow"].log.read_text()
    assert "unexpected bucket that isn't present in the bucket cache" in log
    assert len(observed.usages("slow")) >= 3  # and carried on reporting its own


# --- assignments ---------------------------------------------------------------------------


def test_without_no_assignment_behavior_a_new_bucket_is_allowed(observed: Observed) -> None:
    assert observed.slow_first == [200, 200, 200]  # as the API documents


def test_requests_per_time_unit_is_not_enforced(observed: Observed) -> None:
    # 1 request per minute assigned with a 60 s TTL: everything passes, Envoy logs an error
    assert observed.burst["per-minute"] + observed.later["per-minute"] == [200] * 8
    log = observed.envoys["plain"].log.read_text()
    assert "RequestsPerTimeUnit rate limit strategies are not yet supported" in log


def test_unset_ttl_expires_at_once_so_deny_all_lets_everything_through(
    observed: Observed,
) -> None:
    assert observed.burst["deny-no-ttl"] + observed.later["deny-no-ttl"] == [200] * 8
    assert observed.burst["deny-ttl"] + observed.later["deny-ttl"] == [429] * 8  # control


def test_token_bucket_without_tokens_per_fill_never_refills(observed: Observed) -> None:
    # max_tokens 2, fill_interval 1 s; 2.5 s later still empty
    assert observed.burst["bucket-no-fill"] == [200, 200, 429, 429, 429]
    assert observed.later["bucket-no-fill"] == [429] * 3
    # control: tokens_per_fill 1 refills to the 2 tokens
    assert observed.burst["bucket-fill"] == [200, 200, 429, 429, 429]
    assert observed.later["bucket-fill"] == [200, 200, 429]


def test_a_token_bucket_sent_again_keeps_its_fill_level_as_a_fraction(
    observed: Observed,
) -> None:
    """Not rebuilt full when its numbers change: the share of max_tokens left is kept."""
    # max_tokens 2, one token a minute, spent; the same again at a timer report: still empty
    assert observed.burst["bucket-same"] == [200, 200, 429]
    assert observed.resent["bucket-same"] == [429] * 3
    # 5 of 10 left, then max_tokens 20: 10 (kept tokens would give 5, a new bucket 20)
    assert observed.burst["bucket-grow"] == [200] * 5
    assert observed.resent["bucket-grow"].count(200) == 10, observed.resent["bucket-grow"]
    # a full 10, then max_tokens 3: a full 3
    assert observed.resent["bucket-shrink"] == [200, 200, 200, 429, 429]


def test_a_token_bucket_right_after_a_deny_all_starts_full(observed: Observed) -> None:
    # 2 of 10 left; then DENY_ALL and the same bucket in one response: 10 again
    assert observed.burst["bucket-reset"] == [200] * 8
    assert observed.resent["bucket-reset"] == [200] * 10 + [429] * 2


def test_a_token_bucket_refills_continuously(observed: Observed) -> None:
    # 4 tokens every 4 s: spent, and 2.5 s later about 2.5 back (in one fill, none yet)
    assert observed.burst["bucket-continuous"] == [200, 200, 200, 200, 429]
    assert observed.later["bucket-continuous"].count(200) in (2, 3), observed.later


def test_fill_interval_under_one_second_is_unlimited(observed: Observed) -> None:
    # max_tokens 1 every 0.5 s: 8 quick requests should see 429s; none do
    assert observed.burst["bucket-fast"] + observed.later["bucket-fast"] == [200] * 8


def test_reuse_last_assignment_is_ignored(observed: Observed) -> None:
    # DENY_ALL for 1 s, then expired: `reuse` should keep denying for 60 s, but allows
    assert observed.burst["reuse"] == [429] * 3
    assert observed.later["reuse"] == [200] * 3
    # control: the other expired_assignment_behavior, fallback_rate_limit DENY_ALL, applies
    assert observed.burst["fallback"] == [429] * 3
    assert observed.later["fallback"] == [429] * 3


def test_an_assignment_outlives_the_stream_until_its_ttl(observed: Observed) -> None:
    # DENY_ALL with a 60 s TTL, then the server goes away: still denied
    assert observed.burst["held"] == [429] * 3


def test_a_stream_the_server_ends_is_reopened_at_the_next_timer_report(
    observed: Observed,
) -> None:
    reports = observed.reports("fallback")
    reopened = [r for r in reports if r.stream != reports[0].stream]
    assert reopened and reopened[0].at > observed.ended_at
    assert is_periodic(reopened[0])
    # a new bucket's first request meanwhile: its at-once report went to the closed stream and
    # its count with it; the reopened stream reports it as any other (time_elapsed not 0)
    assert observed.after_end == 200
    new = observed.usages("fallback-new")
    assert new and all(u.elapsed_s > 0 for u in new), new
    assert sum(u.allowed for u in new) == 0, new


# --- outages and stats ----------------------------------------------------------------------


def test_usage_counted_while_the_server_is_unreachable_is_never_reported(
    observed: Observed,
) -> None:
    server = observed.outage_server
    assert observed.outage_allowed == {"outage": 5, "offline": 7}  # ALLOW_ALL meanwhile
    reconnected = [r for r in server.reports if r.stream > 0]
    assert reconnected and reconnected[0].at > observed.restarted_at
    # Envoy reopens the stream at its next timer report, not when the server is back
    assert is_periodic(reconnected[0])
    assert {name_of(u) for u in reconnected[0].usages} == {"outage", "offline", "held"}
    reported = {
        name: sum(u.allowed for u in observed.usages(name, server))
        for name in ("outage", "offline")
    }
    # 1 first request before the outage + 2 after it; the 5 and 7 during it are lost
    assert reported == {"outage": 3, "offline": 0}


def test_the_filter_has_no_stats_of_its_own(observed: Observed) -> None:
    assert observed.stats, "no stats read"
    own = [
        name
        for name in observed.stats
        if ("quota" in name or "rlqs" in name) and not name.startswith("cluster.rlqs.")
    ]
    assert own == []

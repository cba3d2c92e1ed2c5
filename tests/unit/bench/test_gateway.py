"""bench/envoy.py's reading of Envoy's ratelimit counters: answers wrk saw as 200 that the rate
limit service did not decide (failed open, refused, unanswered) count as failed requests."""

from __future__ import annotations

from dataclasses import replace

from bench.envoy import calls_rls, rls_failures
from bench.load import runs
from bench.load.clients import Latency
from bench.load.cpu import CpuWindow
from bench.load.runs import Run


def run(server: str, requests: int, **stats: int) -> Run:
    counters = {"ok": 0, "error": 0, "failure_mode_allowed": 0, "over_limit": 0, **stats}
    window = CpuWindow(1.0, {"envoy": 50.0, "service": 40.0}, 10.0, 0.0, 0.0)
    latency = Latency(1.0, 2.0, 3.0)
    return Run("api-key", "wrk", server, 0, requests, 1.0, 0, "", [], latency, window, counters)


def test_only_stacks_calling_should_rate_limit_are_read() -> None:
    assert [calls_rls(s) for s in ("sidecar", "empty-4", "rls-sidecar")] == [True] * 3
    assert [calls_rls(s) for s in ("plain", "rlqs-sidecar", "rlqs-allow-all")] == [False] * 3
    assert rls_failures(run("plain", 100)) == (0, "")
    assert rls_failures(run("rlqs-sidecar", 100)) == (0, "")


def test_every_request_answered_ok_is_no_failure() -> None:
    assert rls_failures(run("sidecar", 100, ok=100))[0] == 0


def test_fail_open_refusals_and_missing_answers_are_failures() -> None:
    count, why = rls_failures(run("sidecar", 100, ok=90, failure_mode_allowed=6, error=6))
    assert count == 10  # 6 failed calls (each counted as an error and allowed), 4 unanswered
    assert "6 rate limit calls failed" in why
    count, why = rls_failures(run("sidecar", 100, ok=98, over_limit=2))
    assert (count, why) == (2, "2 OVER_LIMIT answers")
    assert rls_failures(run("empty", 100, ok=95)) == (5, "5 requests without an answer")


def test_failures_are_added_to_a_runs_errors_keeping_its_first_error() -> None:
    measured = [run("sidecar", 100, ok=97), replace(run("sidecar", 100), first_error="boom")]
    marked = runs.with_failures(measured, rls_failures)
    assert [(r.errors, r.first_error) for r in marked] == [
        (3, "3 requests without an answer"),
        (100, "boom"),
    ]
    assert runs.with_failures(measured[:1], lambda _: (0, ""))[0] is measured[0]

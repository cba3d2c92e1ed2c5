"""Envoy's side of the Rate Limit Quota Service, as Envoy 1.40.0 really behaves (issue #17).

One `EnvoyBucket` is one gateway's bucket for the simulated key: it enforces the assignment
the server last sent, counts what it allowed and denied, and hands that usage over at each
report. What the server answers is not decided here (that rule has one home, in the core);
this module is only what Envoy does with an answer, pinned to 1.40's measured behaviour:

* reports go out every REPORT_PERIOD_MS whatever `reporting_interval` says, and a new bucket's
  first request triggers a report at once;
* a token bucket starts full (the first one, or one after DENY_ALL, ALLOW_ALL or an expired
  assignment) and refills continuously at tokens_per_fill per fill_interval; without
  tokens_per_fill it never refills, and a fill_interval under 1 s is unlimited; a token bucket
  with other numbers keeps the bucket's fill level as a fraction of max_tokens, the same
  numbers keep its tokens (1.40 compares only the nanos of fill_interval); either way the
  time to live starts again (docs/RLQS-ENVOY.md, pinned in tests/e2e/test_rlqs_envoy.py);
* an assignment expires after its TTL (no TTL: at once), then the fallback applies
  (`no_assignment_behavior`; ALLOW_ALL in the example bootstrap);
* usage counted while the server is unreachable is never reported (`drop_usage`);
* an abandoned bucket is dropped with its usage not yet reported; the next request makes it
  anew under `no_assignment_behavior` and reports it at once (one request).
"""

from __future__ import annotations

from dataclasses import dataclass

from ratelimit_sidecar.core.quota_assign import Action  # the wire actions: one definition

REPORT_PERIOD_MS = 5_000  # 1.40 ignores reporting_interval


@dataclass(frozen=True, slots=True)
class EnvoyAssignment:
    """One bucket's action as it travels on the wire (what Envoy can be told)."""

    action: Action
    ttl_ms: int = 0  # assignment_time_to_live; 0 (unset) expires at once in 1.40
    max_tokens: int = 0
    tokens_per_fill: int = 0  # 0 (unset): the bucket never refills in 1.40
    fill_interval_ms: int = 0  # under 1 s: unlimited in 1.40
    # The response put a DENY_ALL for the bucket just before this one (the servicer does, so
    # that 1.40 builds the new token bucket full): applied in order, no request in between.
    after_blanket: bool = False

    def same_bucket(self, other: EnvoyAssignment | None) -> bool:
        """Whether Envoy keeps its bucket (and its tokens) when `other` follows this one."""
        return (
            other is not None
            and (self.action, self.max_tokens, self.tokens_per_fill)
            == (
                other.action,
                other.max_tokens,
                other.tokens_per_fill,
            )
            and self.fill_interval_ms == other.fill_interval_ms
        )


@dataclass(frozen=True, slots=True)
class Usage:
    """What one report carries for the bucket: counted since the previous report."""

    allowed: int
    denied: int
    elapsed_ms: int  # 1.40 sends whole seconds, 0 on a bucket's first report


class EnvoyBucket:
    """One gateway's bucket for one key: enforcement and usage, on the gateway's clock."""

    def __init__(self, fallback: Action = Action.ALLOW_ALL) -> None:
        self.fallback = fallback
        self.assignment: EnvoyAssignment | None = None
        self.expires_at = 0
        self.tokens = 0.0
        self.filled_at = 0
        self.allowed = self.denied = 0
        self.reported_at: int | None = None  # None: never reported (a new bucket)
        self.built: list[int] = []  # when Envoy built a token bucket full (not rescaled ones)
        self.lost = 0  # allowed requests that no report ever carried (server unreachable)

    @property
    def new(self) -> bool:
        """No report has gone out yet: the next request's report is sent at once."""
        return self.reported_at is None

    def admit(self, now_ms: int) -> bool:
        ok = self._decide(now_ms)
        if ok:
            self.allowed += 1
        else:
            self.denied += 1
        return ok

    def _decide(self, now_ms: int) -> bool:
        current = self.assignment if now_ms < self.expires_at else None
        action = self.fallback if current is None else current.action
        if action is Action.ALLOW_ALL:
            return True
        if action is Action.DENY_ALL or current is None:
            return False
        return self._take_token(current, now_ms)

    def _take_token(self, bucket: EnvoyAssignment, now_ms: int) -> bool:
        if bucket.fill_interval_ms < 1000:
            return True  # 1.40: a sub-second interval does not limit at all
        self._refill(bucket, now_ms)
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def _refill(self, bucket: EnvoyAssignment, now_ms: int) -> None:
        if bucket.tokens_per_fill and bucket.fill_interval_ms:
            rate = bucket.tokens_per_fill / bucket.fill_interval_ms
            refill = (now_ms - self.filled_at) * rate
            self.tokens = min(float(bucket.max_tokens), self.tokens + refill)
        self.filled_at = now_ms

    def assign(self, now_ms: int, assignment: EnvoyAssignment) -> None:
        """An answer from the server: a new bucket, the same one, or the same fill level; or the
        bucket abandoned."""
        if assignment.action is Action.ABANDON:
            self._abandon()
            return
        if assignment.after_blanket:
            self.assign(now_ms, EnvoyAssignment(Action.DENY_ALL, 1000))
        held = self.assignment if now_ms < self.expires_at else None
        if held is None or held.action is not Action.TOKEN_BUCKET:
            self.tokens, self.filled_at = float(assignment.max_tokens), now_ms
            if assignment.action is Action.TOKEN_BUCKET:
                self.built.append(now_ms)
        elif not held.same_bucket(assignment):
            self._refill(held, now_ms)  # under the old numbers up to now
            fill = self.tokens / held.max_tokens if held.max_tokens else 1.0
            self.tokens = fill * assignment.max_tokens
        self.assignment = assignment
        self.expires_at = now_ms + assignment.ttl_ms

    def _abandon(self) -> None:
        """Dropped with its usage not yet reported (never sent); the next request makes it anew,
        under the no-assignment fallback, and reports it at once."""
        self.assignment, self.expires_at, self.tokens = None, 0, 0.0
        self.allowed = self.denied = 0
        self.reported_at = None

    @property
    def rebuilds(self) -> int:
        return len(self.built)

    def take_usage(self, now_ms: int) -> Usage:
        """The report's numbers for this bucket; the counts start again from zero."""
        whole_s = 0 if self.reported_at is None else (now_ms - self.reported_at) // 1000
        usage = Usage(self.allowed, self.denied, whole_s * 1000)
        self.allowed = self.denied = 0
        self.reported_at = now_ms
        return usage

    def drop_usage(self, now_ms: int) -> None:
        """A report that could not be sent: 1.40 never sends those counts again."""
        self.lost += self.take_usage(now_ms).allowed

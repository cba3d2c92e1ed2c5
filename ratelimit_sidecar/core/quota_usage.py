"""One RLQS bucket on a stream: its reports and rechecks in, its assignments out (`BucketQuota`).

What it reads off the limiter's counters (a report's usage counted, the plain assignment, what
a leased window has free) is core/quota_counters.py; which counters and windows are leased,
core/quota_windows.py; leases themselves, core/quota_lease.py.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ratelimit_sidecar.config.model import AlgorithmName
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.limiter import Limiter
from ratelimit_sidecar.core.quota_assign import (
    DEFAULT_POLICY,
    MS,
    Action,
    Assignment,
    Pace,
    QuotaPolicy,
    TokenBucket,
    abandoned,
    allow_all,
    deny_until,
)
from ratelimit_sidecar.core.quota_counters import (
    free_of,
    likely_unreported,
    report_usage,
    trailing,
)
from ratelimit_sidecar.core.quota_lease import DEFAULT_LEASE, LEASE_FILL_S, Free, Grant, Lease
from ratelimit_sidecar.core.quota_settle import kept, renewed, settle
from ratelimit_sidecar.core.quota_windows import LeaseWindows, TrailingLeases, gateways, leasable
from ratelimit_sidecar.core.spancounts import SpanState
from ratelimit_sidecar.core.types import Hit

LEASE_MIN_RECHECK_MS = 100  # a lease's recheck is no sooner than this


class BucketQuota:
    """One stream's bucket: the assignment Envoy holds, and what was reported spent from it."""

    def __init__(self, policy: QuotaPolicy = DEFAULT_POLICY) -> None:
        self.policy = policy
        self.sent: Assignment | None = None
        self.spent = 0
        self.reported_ms: int | None = None  # the last report's time (None: none yet)
        self.rate = 0.0  # offered (allowed and denied) per ms over the last report's period
        self.idle = 0  # reports in a row with nothing allowed or denied
        self.lease = Lease()  # a leased counter's (`leasable`)
        self.windows = LeaseWindows()  # which windows are leased (`_leases`)
        self.trail = TrailingLeases()  # ... or, in a trailing window, when
        self.handover: tuple[int, int] | None = None  # a trailing lease took a plain bucket over:
        # when, and that bucket's tokens (`_after_handover`)
        self.handing_over = False  # its plain bucket not abandoned yet (`_rolled`)
        # A trailing window's share until the next report: the nodes estimate its last report
        # read (0: the counter's own). It moves at every sync; raised at a recheck, it rebuilt
        # full a bucket that a burst drained unreported (8 gateways, boundary bursts at twice
        # MAX: 273 of 240 in a trailing window; 241 so). A report tells what was spent.
        self.report_nodes = 0.0

    @property
    def recheck_ms(self) -> int:
        return self.sent.recheck_ms if self.sent is not None else 0

    @property
    def abandoned(self) -> bool:
        """Abandoned (idle, or a lease at its window's end), its gateway has not made it anew."""
        return self.sent is not None and self.sent.action is Action.ABANDON

    @property
    def forgotten(self) -> bool:
        """Abandoned with nothing kept for the request that makes it anew: drop it at once."""
        return self.abandoned and not self.recheck_ms

    def report(
        self,
        limiter: Limiter,
        hit: Hit,
        now_ms: int,
        streams: int = 1,
        *,
        denied: int = 0,
        keep_denied: bool = True,
    ) -> Assignment | None:
        self.idle = self.idle + 1 if hit.hits <= 0 and denied <= 0 else 0
        if abandoned(self.idle, self.policy) and not self._kept_idle(keep_denied):
            self.idle, self.sent = 0, Assignment(Action.ABANDON, 0, now_ms)
            return self.sent  # Envoy forgets the bucket, and so does its stream (`forgotten`)
        if self.sent is not None:
            self.spent += max(0, hit.hits)
        # Since the last report; a bucket first seen here may carry a whole report period.
        since = self.reported_ms
        if since is None and hit.hits > 1:
            since = now_ms - self.policy.report_interval_ms
        if since is not None and now_ms > since:
            self.rate = (max(0, hit.hits) + max(0, denied)) / (now_ms - since)
        self.reported_ms = now_ms
        leasing, took_over = self._leases(limiter, hit, now_ms, reported=True)
        if took_over and not leasing:  # back to plain: the report counted as the lease's
            hit = hit._replace(hits=0)
        if leasing:
            if took_over and hit.hits > 0:  # the plain bucket's: in its windows, pro rata
                limiter.count_admitted(now_ms, hit, since, edge_over_ms=self.policy.edge_over_ms)
                hit = hit._replace(hits=0)
            return self._lease_report(limiter, hit, now_ms, streams)
        return self._plain_report(limiter, hit, now_ms, streams, since)

    def _plain_report(
        self, limiter: Limiter, hit: Hit, now_ms: int, streams: int, since: int | None
    ) -> Assignment | None:
        pace = Pace(self.rate)
        fresh = report_usage(limiter, hit, now_ms, streams, self.policy, since_ms=since, pace=pace)
        state, trails = limiter.keys.get(hit.key), trailing(hit.rule)
        self.report_nodes = state.nodes.value if state is not None and trails else 0.0
        return self._settle(fresh, now_ms, 0.0, trails)

    def recheck(
        self, limiter: Limiter, hit: Hit, now_ms: int, streams: int = 1
    ) -> Assignment | None:
        """No report: on the counters, less what the gateway likely spent since its report (a
        trailing window: at its last report's share)."""
        if self.abandoned:  # Envoy holds no bucket to assign until a request makes it anew
            return None
        if self._leases(limiter, hit, now_ms)[0]:
            return self._lease_recheck(limiter, hit, now_ms, streams)
        pace = self._pace(now_ms)
        quiet, nodes = hit._replace(hits=0), self.report_nodes
        fresh = report_usage(limiter, quiet, now_ms, streams, self.policy, pace=pace, nodes=nodes)
        unreported = 0.0 if hit.rule is None else likely_unreported(hit.rule, pace, now_ms)
        return self._settle(fresh, now_ms, unreported, trailing(hit.rule))

    def _leases(
        self, limiter: Limiter, hit: Hit, now_ms: int, reported: bool = False
    ) -> tuple[bool, bool]:
        """Whether the bucket is leased now (core/quota_windows.py), and whether it just took
        over the plain bucket Envoy holds (given up as a lease's at once, or at its window's
        end) or, in a trailing window, went back to plain."""
        rule = hit.rule
        if not leasable(rule, self.policy):
            return False, False
        assert rule is not None
        if rule.limits[0].strict:
            return True, False
        if rule.limits[0].algorithm is AlgorithmName.SLIDING_WINDOW:
            return self._trailing_leases(limiter, hit, now_ms, reported)
        leasing, turned = self.windows.at(limiter, hit, now_ms, self.policy.lease_from)
        sent = self.sent
        if not (leasing and turned) or sent is None or sent.bucket is None:
            return leasing, False
        self.lease.take_over(self.windows.window, self._pace(now_ms).held, self.rate, now_ms)
        return True, True

    def _trailing_leases(
        self, limiter: Limiter, hit: Hit, now_ms: int, reported: bool
    ) -> tuple[bool, bool]:
        """A trailing window at the edge (core/quota_windows.py `TrailingLeases`); the second
        value: it turned this time, either way."""
        assert hit.rule is not None
        limit, state = hit.rule.limits[0], limiter.keys.get(hit.key)
        if reported and self.rate > 0:
            self.trail.report(self.rate * gateways(limiter, state) * limit.window_ms)
        was, near = self.trail.leasing, self.policy.trailing_near
        leasing = self.trail.choose(now_ms, limit.requests_per_unit, limit.window_ms, near)
        if was and not leasing and state is not None:
            self._lease_leave(limiter, state, hit if reported else hit._replace(hits=0), now_ms)
            return False, True
        sent = self.sent
        if not leasing or was or sent is None or sent.bucket is None:
            return leasing, False
        self.lease = Lease()
        self.lease.take_over(-1, self._pace(now_ms).held, self.rate, now_ms)
        self.handover, self.handing_over = (now_ms, sent.bucket.max_tokens), True
        return True, True

    def _lease_leave(self, limiter: Limiter, state: KeyState, hit: Hit, now_ms: int) -> None:
        """Back to plain: what the lease counted beyond what was reported spent goes back, as the
        plain assignments count the bucket's usage when it is reported. Kept counted, it held a
        window's room after the leases ended (seed 1, 4 gateways: 17.5 / 27.7 % refused at 0.8
        and 0.95 x MAX; 16.6 / 26.4 % given back)."""
        lease = self.lease
        lease.report(max(0, hit.hits), now_ms, self.rate)
        lease.upper = lease.allowance = 0.0
        self._count_lease(limiter, state, now_ms)
        limiter.owe_lease(state, id(self), 0, now_ms)
        self.lease, self.handover = Lease(), None

    def _after_handover(self, free: Free, now_ms: int) -> Free:
        """For a report period after a trailing window's lease took a plain bucket over, the
        other gateways' plain buckets may still spend what no report told: each as much as this
        gateway's pace until then, or its plain bucket whole (a burst spends it at once); taken
        as spent. A lease counted none of it: twice MAX passed it by a third (4 gateways, seeds 1
        to 3, worst trailing window, before plain buckets kept Envoy's fraction: boundary bursts
        321 of 240, skewed traffic 315; 282 and 240 so; the plain assignments 289 and 350)."""
        if self.handover is None or self.handover[0] + self.policy.report_interval_ms <= now_ms:
            return free
        since, tokens = self.handover
        left = since + self.policy.report_interval_ms - now_ms
        taken = (free.live_nodes * free.streams - 1) * max(self.rate * left, float(tokens))
        return replace(free, free=free.free - math.ceil(taken))

    def _pace(self, now_ms: int) -> Pace:
        if self.reported_ms is None or self.sent is None or self.sent.bucket is None:
            return Pace(self.rate)
        held = self.sent.held(now_ms, self.spent)
        return Pace(self.rate, now_ms - self.reported_ms, held)

    def _settle(
        self, fresh: Assignment, now_ms: int, unreported: float, trails: bool = False
    ) -> Assignment | None:
        send = settle(
            self.sent,
            fresh,
            now_ms,
            self.policy,
            spent=self.spent,
            unreported=unreported,
            trailing=trails,
        )
        if send is None:
            assert self.sent is not None  # settle sends whatever is new
            self.sent = kept(self.sent, fresh)
            return None
        if send.built_ms == 0:  # a new bucket (a resend keeps the one Envoy built)
            self.spent = 0
        self.sent = send
        return send

    def _lease_report(
        self, limiter: Limiter, hit: Hit, now_ms: int, streams: int
    ) -> Assignment | None:
        state = limiter.lease_counter(now_ms, hit)
        if state is None:
            return self._settle(allow_all(now_ms, self.policy), now_ms, 0.0)
        lease = self.lease
        # A window's end abandons the bucket, unless its gateway has held none since the last.
        rolled = self._rolled(state)
        # All of it in the current window: a report that spans the window's start (the bucket
        # not abandoned yet) has its part from before unknown; counted pro rata, that part went
        # missing from the window's leases (+7 % at twice MAX).
        lease.report(max(0, hit.hits), now_ms, self.rate)
        if rolled:
            return self._lease_abandon(limiter, state, now_ms, 0)
        return self._lease_decide(limiter, state, now_ms, streams)

    def _lease_recheck(
        self, limiter: Limiter, hit: Hit, now_ms: int, streams: int
    ) -> Assignment | None:
        state = limiter.lease_counter(now_ms, hit)
        if state is None:
            return None
        if self._rolled(state):
            since = now_ms % state.limit.window_ms
            if isinstance(state.counts, SpanState):  # a plain bucket handed over: since its report
                since = now_ms - (self.reported_ms or now_ms)
            return self._lease_abandon(limiter, state, now_ms, since)
        return self._lease_decide(limiter, state, now_ms, streams)

    def _rolled(self, state: KeyState) -> bool:
        """A fixed window's end: the bucket held is abandoned (`_lease_abandon`). A trailing
        window has no end: its lease goes on (core/sliding_window.py moves what it holds); only
        a plain bucket a lease took over is abandoned, at once."""
        if isinstance(state.counts, SpanState):
            self.lease.rebase(state.window)
            handing_over, self.handing_over = self.handing_over, False
            return handing_over and not self.abandoned
        return self.lease.roll(state.window) and not self.abandoned

    @property
    def denies_for_good(self) -> bool:
        """It holds a deny list's DENY_ALL, which no block's end lifts."""
        sent = self.sent
        return sent is not None and sent.action is Action.DENY_ALL and not sent.recheck_ms

    def _kept_idle(self, keep_denied: bool) -> bool:
        """Under a DENY_ALL an idle bucket is kept: abandoned, the request that makes it anew
        passes by Envoy's no-assignment fallback, so a key blocked for a day admitted every
        request that came a minute or more after the last (simulator, 2,000 a day at twice MAX
        on 4 gateways: up to 3,394 a day), and a client on a deny list that asked once a minute
        passed every time. A block's until it ends; a deny list's, which never ends, while its
        stream has room for it (`keep_denied`: service/quota.py bounds them)."""
        sent = self.sent
        if sent is None or sent.action is not Action.DENY_ALL:
            return False
        return sent.recheck_ms > 0 or keep_denied

    def _lease_abandon(
        self, limiter: Limiter, state: KeyState, now_ms: int, since_start_ms: int
    ) -> Assignment:
        """A new window: the bucket goes, its next report counts only this window's requests."""
        self.lease.abandon(since_start_ms)
        self._count_lease(limiter, state, now_ms)
        self.sent = Assignment(Action.ABANDON, 0, now_ms, recheck_ms=now_ms + self.policy.forget_ms)
        self.spent, self.reported_ms = 0, None  # its first report is one request, not a pace
        return self.sent

    def _lease_decide(
        self, limiter: Limiter, state: KeyState, now_ms: int, streams: int
    ) -> Assignment | None:
        # A block is not consulted: leases may hold the count over MAX until reports return them.
        free = self._after_handover(free_of(limiter, state, now_ms, streams), now_ms)
        grant = self.lease.decide(free, now_ms)
        send = self._lease_assignment(grant, now_ms)
        self._count_lease(limiter, state, now_ms)
        return send

    def _count_lease(self, limiter: Limiter, state: KeyState, now_ms: int) -> None:
        lease = self.lease
        delta = lease.target() - lease.reserved
        if delta:
            limiter.count_lease(state, delta, now_ms)
            lease.reserved += delta
        limiter.owe_lease(state, id(self), lease.target() - lease.used, now_ms)

    def _lease_assignment(self, grant: Grant, now_ms: int) -> Assignment | None:
        recheck = max(grant.recheck_ms, now_ms + LEASE_MIN_RECHECK_MS)
        sent = self.sent
        if sent is not None and sent.action is Action.ABANDON:
            sent = None  # Envoy holds no bucket: a new one is built full
        if grant.tokens is None and sent is not None and sent.action is not Action.DENY_ALL:
            return self._lease_keep(sent, recheck, now_ms)
        if not grant.tokens:  # nothing free; or nothing to keep: a DENY_ALL holds no tokens
            recheck = min(recheck, now_ms + DEFAULT_LEASE.denied_recheck_ms)
            self.lease.build(0, now_ms)
            if (
                sent is not None
                and sent.action is Action.DENY_ALL
                and sent.expires_ms > recheck + MS
            ):
                self.sent = replace(sent, recheck_ms=recheck)
                return None
            self.sent = deny_until(now_ms, recheck - now_ms)
            return self.sent
        self.lease.build(grant.tokens, now_ms)
        bucket = TokenBucket(grant.tokens, 1, LEASE_FILL_S)
        replaces = sent is not None and sent.action is Action.TOKEN_BUCKET
        self.sent = Assignment(
            Action.TOKEN_BUCKET,
            self.policy.ttl_s,
            now_ms,
            bucket,
            recheck,
            replaces_bucket=replaces,
        )
        self.spent = 0
        return self.sent

    def _lease_keep(self, sent: Assignment, recheck: int, now_ms: int) -> Assignment | None:
        """Nothing new: the same assignment again when about to expire (Envoy keeps its tokens)."""
        if sent.expires_ms - now_ms > self.policy.refresh_before_ms:
            self.sent = replace(sent, recheck_ms=recheck)
            return None
        self.sent = renewed(sent, now_ms, recheck)
        return self.sent

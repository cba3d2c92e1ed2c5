"""Leases: an RLQS gateway's fixed window counted before it is spent (pure; `now_ms` a parameter).

An Envoy on `rate_limit_quota` reports its usage every few seconds (5 s in 1.40), so a counter fed
by reports learns a gateway's admissions up to a report late, and no push of that counter can hold
a window at MAX. A lease turns it around: every token a gateway's bucket is handed is counted into
the counter (and pushed at once, announced as a push at the edge) when it is handed out, so the
store's total for the window is what the fleet *may* admit, not what it reported. The fleet admits
at most what it was leased; a window never holds more leases than MAX:

- A lease is at most `share` of what the window has free (MAX less the store's total and this
  node's unpushed counts) divided by the live nodes and this node's streams for the bucket: the
  leases granted at one instant by every node add up to at most what is free. A node whose
  `nodes` estimate says it carries `uneven` times an even part of the fleet's traffic or more
  takes its part by that estimate instead: held to an even part, a gateway taking 60 % of the
  traffic ran dry while its peers' leases stood unspent (simulator, 4 gateways at skewed 0.9 x
  MAX: 5.3 % refused before, 3.6 % after). Only a clear excess counts: estimates a little under
  the live node count on every node at once took more than was free at a window's start
  (boundary traffic at 10 times MAX: 249 of 240).
- A gateway's pace blends its reports (`PACE_WEIGHT` the newest): a 5 s count is noisy, and a
  quiet report made a busy bucket look full (simulator, 4 gateways: 5.4 / 10.3 / 9.2 % refused
  at 0.8, 0.95 and skewed 0.9 x MAX before, 4.4 / 9.5 / 8.4 % after). But a report that leaves
  the bucket dry takes a rise whole: blended, a burst's top-up ran dry again before the next
  report (bursts at 0.8 x MAX: 4.5 % refused before, 3.6 % after; 0.8 x MAX 2.2 %, 1.8 %).
  Beyond reach of the reset a lease is sized for any rise whole (`_risen`).
- A gateway gets enough for its pace over `horizon_ms` (its next report and a second), more in
  proportion far from MAX, and in a window longer than that `spare` of its pace past it, out of
  what the fleet's pace leaves free (simulator, 4 gateways, a minute's window: 2.8 / 2.8 / 3.4 %
  refused at 0.8, 0.95 and skewed 0.9 x MAX, bursts at 0.8 x 19 %, before; 1.5 / 2.9 / 2.7 % and
  9.6 % after). Within `reach_ms` of the reset (two of Envoy's reports) it gets its pace until
  the reset, `margin` more far from MAX: no report will come in time to top it up better
  (10 s windows, 4 gateways: 3.0 / 5.9 / 6.9 % refused at 0.8, 0.95 and skewed 0.9 x MAX
  before, 2.3 / 3.4 / 5.4 % after). Far from MAX: the window holds the fleet's pace until the
  reset (this gateway's pace times the gateways its node stands for, by the `nodes` estimate)
  counting what the other gateways' leases hold, each taken as this one's last lease, at most
  its pace until then: counted in the window but not spent, their pace spends them. Without
  them a lease was far from MAX only while no other was outstanding (10 s windows, 4 gateways:
  1.8 / 3.6 / 3.7 % refused at 0.8, 0.95 and skewed 0.9 x MAX, bursts 3.6 %, before; 1.0 /
  2.9 / 3.5 %, 2.7 % after). It is topped up
  when its bucket likely falls under `low` of that; Envoy builds each lease full (a DENY_ALL
  goes first), so the old bucket's unspent tokens are gone: they stay counted until the next
  report tells what was spent. So while the window has `scarce` little free, a bucket is kept
  until it likely ran dry (simulator, 4 gateways at skewed 0.9 x MAX: 10.2 % refused against
  13.4 %). And in a window longer than `reach_ms`, while the headroom holds every gateway's
  bucket `early_room` times over, it is topped up under `early` of the lease it would get: a
  burst found a bucket topped up only when low half spent, ran it dry and waited for the next
  report (a minute's window, 4 gateways: bursts at 0.8 x MAX 7.3 % refused before, 5.5 %
  after; 0.8, 0.95 and skewed 0.9 x MAX within 0.1 point).
- At each report the counted reservation becomes what was reported spent in the window plus the
  most the bucket can still hold (`upper`); the rest goes back (counted negative), netted against
  this node's next lease. Beyond that the store's total drops, but no node lowers the count it
  read for a window (a late answer must not undo counts): it serves no other gateway.
- `upper` is what is counted, not what is decided on. A report after a lease took the bucket it
  replaced spends from the old bucket first: the most the new one can hold. Decisions read what
  it likely holds (`likely`): the old bucket spent at the gateway's pace until it was replaced.
  Taken as full, a dry bucket was kept until its next report (simulator, a minute's window, 4
  gateways: 1.8 / 2.6 / 1.8 % refused at 0.8, 0.95 and skewed 0.9 x MAX before, 0.5 / 1.7 / 0.9
  % after).
- **A new window abandons the bucket** (`roll`, then `abandon`; windows of a minute at most,
  quota_usage.py). Envoy drops an abandoned bucket with its usage not yet reported, and
  reports the request that makes it anew at once, alone (admitted by its no-assignment
  fallback; counted here in advance); its next reports count only what it admitted since. So a
  report never spans a window's start: its usage is this window's, exactly. Counted wholly in
  the new window, a report's part from before the window's start held a quarter of a 10 s
  window's leases on counts that were never spent (simulator, 4 gateways: 4.4 / 8.6 / 8.2 %
  refused at 0.8, 0.95 and skewed 0.9 x MAX before, 3.0 / 5.9 / 6.9 % after; the exact split,
  which only the simulator knew, left 3.4 / 7.9 / 11.4 %).
- A node that never read the window's total (it just started) leases one token first, and the
  rest once its push has answered: a share taken on a count of 0 passed MAX by that share
  whenever a node joined a full window, and a node that just started knows neither the count
  nor the live nodes (simulator, churn at ten times MAX: a quarter of MAX taken as a node's
  first lease, 301 of 240; one token: 243).
- Nothing free: DENY_ALL, decided again at the next sync or within a second (other gateways'
  reports give back what their leases did not spend), at the latest at the window's reset. A
  DENY_ALL holds no tokens, so it is never kept: the servicer denies again (quota_usage.py).
  But a bucket that may still hold tokens (its pace says spent, its report has not) is kept:
  a DENY_ALL over it frees nothing, its tokens stay counted until the report, and the gateway
  loses them (simulator, 4 gateways: 4.4 / 9.5 / 8.4 % refused at 0.8, 0.95 and skewed 0.9 x
  MAX before, 4.4 / 8.6 / 8.2 % after; a minute's boundary traffic at twice MAX admitted 914 a
  window on average before, 999 after: the window stranded in buckets denied with tokens).

A sliding window's lease (`strict`, or `edge` near MAX: quota_windows.py) is the same but for its
window: what is free is MAX less the trailing count, no window end abandons the bucket (`rebase`),
what a bucket has not reported spent moves to the current span at each sync (core/spancounts.py,
`LeasedSpans`), and a gateway takes no more than an even part of what is free (`Free.resets`).

A lease bucket refills one token per `LEASE_FILL_S` (Envoy 1.40 never refills a bucket without
`tokens_per_fill`, and refills continuously): at most one token a window more than leased.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MS = 1000
LEASE_FILL_S = 3600  # a lease bucket's refill: one token an hour
PACE_WEIGHT = 0.3  # the newest report's part of a gateway's pace; the rest is the pace before


@dataclass(frozen=True, slots=True)
class LeasePolicy:
    horizon_ms: int = 6000  # a lease covers the pace until the next report (5 s) and a second
    low: float = 0.25  # topped up under this share of a horizon's need
    early: float = 0.7  # in a long window with room, topped up under this share of its lease
    early_room: float = 3.0  # room: the headroom holds every gateway's bucket this many times
    scarce: float = 0.5  # less free than this share of every gateway's need: kept until dry
    share: float = 1.0  # of what is free, at most this over (live nodes x streams) per lease
    far: float = 2.0  # far from MAX a lease may cover this many horizons
    spare: float = 1.0  # and this part of its pace past them until the reset, out of the spare
    reach_ms: int = 10_000  # this near the reset (two reports), its pace until then ...
    margin: float = 1.2  # ... and this much more far from MAX
    uneven: float = 1.5  # a node carrying this many even parts of the traffic takes its part
    denied_recheck_ms: int = 1000  # denied, decided again this often (leases come back)


DEFAULT_LEASE = LeasePolicy()


@dataclass(frozen=True, slots=True)
class Free:
    """What the counter says of the lease's fixed window at `now_ms`."""

    limit: int  # MAX
    free: int  # MAX less the window's known count (the store's total and own unpushed counts)
    until_reset_ms: int
    until_sync_ms: int  # until this node next learns the fleet's count
    live_nodes: int = 1
    streams: int = 1
    heard: bool = True  # the store's total for the window was read (False: a node just started)
    nodes: float = 0.0  # the counter's nodes estimate: this node carries 1/nodes (0: unknown)
    resets: bool = True  # a fixed window (False: a trailing one, freed as its spans leave)


@dataclass(frozen=True, slots=True)
class Grant:
    """A decision: `tokens` > 0, a new lease built full; 0, DENY_ALL; None (`keep`), nothing new.
    `recheck_ms`: decide again then without a report."""

    tokens: int | None
    recheck_ms: int


class Lease:
    """One gateway's bucket of one fixed-window counter: what it was leased and spent."""

    __slots__ = (
        "allowance",
        "before",
        "built_ms",
        "latest",
        "leased",
        "likely",
        "rate",
        "reported_ms",
        "reserved",
        "upper",
        "used",
        "window",
    )

    def __init__(self) -> None:
        self.window = -1
        self.used = 0  # reported spent in `window`
        self.reserved = 0  # counted into the counter for `window`
        self.upper = 0.0  # the most the gateway's current bucket holds, as of its last report
        self.likely = 0.0  # what it likely holds then: decisions read this, `upper` is counted
        self.before = 0.0  # of the usage since that report, likely spent by replaced buckets
        self.allowance = 0.0  # tokens of buckets replaced since that report: spendable meanwhile
        self.reported_ms = -1
        self.built_ms = -1  # the current bucket's build (full at `upper`)
        self.leased = 0  # the tokens of the last lease built (0: a DENY_ALL)
        self.rate = 0.0  # requests offered per ms: the reports' pace, blended (`PACE_WEIGHT`)
        self.latest = 0.0  # the newest report's own pace

    def roll(self, window: int) -> bool:
        """A new window: nothing of it counted yet. True: the gateway holds a bucket (or a
        DENY_ALL) of the window before, to abandon (`abandon`)."""
        if window == self.window:
            return False
        held = self.window >= 0 and self.built_ms >= 0
        self.window, self.used, self.reserved = window, 0, 0
        return held

    def rebase(self, window: int) -> None:
        """A trailing window's lease in a new fixed window: nothing abandoned, its counts kept;
        `used` counts from here (what the lease may take of MAX, `_cap`)."""
        if window != self.window:
            self.window, self.reserved, self.used = window, self.reserved - self.used, 0

    def abandon(self, since_start_ms: int) -> None:
        """Envoy drops the bucket with its unreported usage. Counted in this window: what the
        bucket may have spent in it before (`since_start_ms`, at twice its pace), which no
        report will tell, and the request that makes the bucket anew (Envoy admits it by its
        no-assignment fallback and reports it alone at once)."""
        early = min(self.allowance + self.upper, 2 * self.rate * since_start_ms)
        self.used += math.ceil(early)
        self.allowance, self.upper = 0.0, 1.0
        self.likely, self.before = 1.0, 0.0

    def take_over(self, window: int, held: float, rate: float, now_ms: int) -> None:
        """A plain bucket (core/quota_windows.py) taken as the lease of the window before
        `window`, holding at most `held`: `roll` then abandons it, as a lease at its window's
        end (what it likely spent since the window's start, at twice `rate` per ms)."""
        self.window, self.built_ms = window - 1, now_ms
        self.upper = self.likely = held
        self.allowance = self.before = 0.0
        self.rate = self.rate or rate

    def report(self, allowed: int, now_ms: int, rate: float) -> None:
        """`allowed` since the last report, counted in the current window; at most, taken from
        the replaced buckets' tokens first; likely, from them as much as their pace spent."""
        self.upper = max(0.0, self.upper - max(0.0, allowed - self.allowance))
        self.likely = min(self.upper, max(0.0, self.likely - max(0.0, allowed - self.before)))
        self.allowance = self.before = 0.0
        self.used += allowed
        self.reported_ms, self.rate, self.latest = now_ms, self._paced(rate), rate

    def _paced(self, rate: float) -> float:
        """Blended, unless the report leaves the bucket likely dry and its pace rose: the gateway
        ran out because it got busier, and a top-up by the blended pace ran dry again before the
        next report."""
        blended = self._blended(rate)
        return rate if self.likely < 1 and rate > blended else blended

    def _blended(self, rate: float) -> float:
        """One report counts a few seconds: a quiet one made a busy bucket look full (kept while
        it ran dry), a busy one a quiet bucket look empty. Blended with the pace before."""
        if not self.rate:
            return rate
        return PACE_WEIGHT * rate + (1 - PACE_WEIGHT) * self.rate

    def held(self, now_ms: int) -> float:
        """What the bucket likely holds now: `likely` less the pace since the report. Only
        decisions read it; what is counted is `target`."""
        last = max(self.reported_ms, self.built_ms)
        since = max(0, now_ms - last) if last >= 0 else 0
        return max(0.0, self.likely - self.rate * since)

    def decide(self, free: Free, now_ms: int, policy: LeasePolicy = DEFAULT_LEASE) -> Grant:
        cap = policy.share * self._cap(free, policy)
        if not free.heard and self.built_ms < 0:  # a first lease on a count not read yet
            return Grant(1 if cap >= 1 else 0, now_ms)  # decided again once the push answered
        if not self.rate:  # no pace reported yet: an even part, the fair share at most
            held = self.held(now_ms)
            if held + 1 >= cap:
                return Grant(None, now_ms + free.until_reset_ms)
            return Grant(math.floor(cap), now_ms + free.until_reset_ms)
        need, room = self._need(free, policy)
        scarce = free.free < policy.scarce * need * free.live_nodes * free.streams
        need = self._risen(need, free, policy)
        low, held = (0.0 if scarce else policy.low) * need, self.held(now_ms)
        want = need * room + self._spare(free, policy)
        tokens = math.floor(min(cap, max(1.0, want)))
        if not scarce and self._roomy(free, policy, held):
            low = max(low, policy.early * tokens)
        if held > low or (held > 0 and (tokens <= held or scarce)):  # it would destroy tokens
            return Grant(None, self._dry_at(held - low if held > low else held, now_ms, free))
        if tokens < 1:
            wait = min(free.until_sync_ms, free.until_reset_ms, policy.denied_recheck_ms)
            if self.upper > 0:  # it may hold tokens: a DENY_ALL frees none
                return Grant(None, now_ms + wait)
            return Grant(0, now_ms + wait)
        return Grant(tokens, self._dry_at(tokens - low, now_ms, free))

    def _roomy(self, free: Free, policy: LeasePolicy, held: float) -> bool:
        """Whether a top-up's price is cheap: the tokens it destroys stay counted until the next
        report, and far from MAX the headroom carries that for every gateway. Topped up only
        once low, a bucket in a long window met a burst half spent and ran dry before the
        report that would have told. Not within reach of the reset: tokens given back then
        seldom serve another lease before it."""
        if free.until_reset_ms <= policy.reach_ms:
            return False
        gateways = max(1, free.live_nodes * free.streams)
        return self._headroom(free) >= policy.early_room * gateways * held

    def _cap(self, free: Free, policy: LeasePolicy) -> float:
        """Of what is free, an even part (this node's part where it clearly carries more); up to
        its fair share of MAX while it holds less. Not in a trailing window: little is free in
        it at any time, and the gateways' fair shares of MAX, each capped by what is free, add
        up to that many times it (simulator, 8 gateways churning at ten times MAX: 322 of 240
        in a trailing window; 230 with this)."""
        gateways = max(1, free.live_nodes * free.streams)
        fair = free.limit / gateways - (self.used + self.allowance + self.upper)
        if not free.resets:
            fair = 0.0
        part = free.free / gateways
        if 0 < free.nodes * policy.uneven <= free.live_nodes:
            part = max(part, free.free / max(1.0, free.nodes * free.streams))
        return max(0.0, min(float(free.free), max(part, fair)))

    def _need(self, free: Free, policy: LeasePolicy) -> tuple[float, float]:
        """The pace over a horizon, or until the reset within reach of it; and how many of
        those a lease covers: more while the fleet is far from MAX."""
        far = self._headroom(free) >= 0
        if free.until_reset_ms <= policy.reach_ms:
            return self.rate * free.until_reset_ms, policy.margin if far else 1.0
        return self.rate * policy.horizon_ms, policy.far if far else 1.0

    def _risen(self, need: float, free: Free, policy: LeasePolicy) -> float:
        """What a lease is sized for, and topped up under: beyond reach of the reset a rise in
        the newest report counts whole. Blended, a burst that began after a report found a
        bucket sized for the pace before and ran it dry before the next (a minute's window, 4
        gateways: bursts at 0.8 x MAX 5.5 % refused before, 4.0 % after). Within reach it does
        not: in 10 s windows, all within reach, it stranded tokens in quiet gateways' buckets
        (skewed 0.9 x MAX: 3.5 % refused blended, 4.0 % whole). Whether little is free stays
        judged by the blended pace: every gateway's need is not one gateway's burst."""
        if free.until_reset_ms <= policy.reach_ms or self.latest <= self.rate:
            return need
        return self.latest * policy.horizon_ms

    def _spare(self, free: Free, policy: LeasePolicy) -> float:
        """A window longer than a lease's horizons: a part of the pace past them, out of what the
        fleet's pace until the reset leaves free (an even part). Leases cover the pace for seconds
        so a window is not stranded in unspent leases; in a window of a minute a burst then ran
        its bucket dry while most of the window stood free."""
        beyond = free.until_reset_ms - policy.far * policy.horizon_ms
        spare = self._headroom(free)
        if beyond <= 0 or spare <= 0:
            return 0.0
        gateways = max(1, free.live_nodes * free.streams)
        return min(spare / gateways, policy.spare * self.rate * beyond)

    def _headroom(self, free: Free) -> float:
        """What the window holds beyond the fleet's pace until the reset. `free` lacks what the
        other gateways' leases hold, counted but not spent yet, which their pace spends within
        that need: each taken as this gateway's last lease, at most its pace until then.
        Without them a lease was far from MAX only while no other one was outstanding."""
        others = free.live_nodes * free.streams - 1
        held = others * min(float(self.leased), self.rate * free.until_reset_ms)
        return free.free + held - self._fleet_need(free)

    def _fleet_need(self, free: Free) -> float:
        """What the fleet takes until the reset: this gateway's pace times the gateways its
        node's traffic stands for (the counter's `nodes` estimate; unknown, the live nodes)."""
        nodes = max(1.0, free.nodes) if free.nodes > 0 else free.live_nodes
        return self.rate * nodes * free.streams * free.until_reset_ms

    def _dry_at(self, spare: float, now_ms: int, free: Free) -> int:
        """When the bucket likely falls to its low mark (at the reset the window rolls anyway)."""
        until = free.until_reset_ms
        if spare < self.rate * until:  # compared, not divided: a blended pace may near 5e-324
            until = max(0, math.floor(spare / self.rate))
        return now_ms + until

    def build(self, tokens: int, now_ms: int) -> None:
        """A lease of `tokens` replaces the bucket (or a DENY_ALL, with `tokens` 0). The new one
        holds `tokens`; what the old one held, the next report may take from it (likely, what
        its pace spent until now)."""
        self.before += self.likely - self.held(now_ms)
        self.allowance += self.upper
        self.upper, self.built_ms = float(tokens), now_ms
        self.leased = tokens
        self.likely = float(tokens)

    def target(self) -> int:
        """What the window must hold counted for this gateway."""
        return self.used + math.ceil(self.allowance + self.upper)

"""A refusal's Retry-After (`Verdict.reset_ms`) is a wait after which the same request is
admitted, and not much longer than needed: every refusal path of every algorithm, on a fake
clock (issue #16, item 3).

Each test drives a key over its limit, takes the first refusal's wait, and retries the same
request exactly then (and, where the algorithm is exact, one millisecond earlier: still
refused, so the wait is the shortest that works). A fleet node syncs at every span end on the
way, as the sync loop would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Rule, Unit
from ratelimit_sidecar.core import (
    Code,
    FleetLimiter,
    Hit,
    Limiter,
    LocalLimiter,
    PushResult,
    SyncResult,
    Verdict,
)
from simulator.memory_store import MemoryStorage

T0 = 1_700_000_040_000  # a window boundary for every unit up to a minute
FIXED, WINDOW = AlgorithmName.FIXED_WINDOW, AlgorithmName.SLIDING_WINDOW
BUCKET, LOG = AlgorithmName.TOKEN_BUCKET, AlgorithmName.SLIDING_LOG


def make_rule(
    algorithm: AlgorithmName,
    rpu: int = 10,
    *,
    seconds: int = 1,
    spans: int = 6,
    cooldown_ms: int = 0,
    burst: int = 0,
) -> Rule:
    limit = RateLimit(
        rpu,
        Unit.SECOND,
        seconds,
        spans=spans,
        cooldown_ms=cooldown_ms,
        algorithm=algorithm,
        burst=burst,
    )
    return Rule("d", (("k", ""),), limit)


@dataclass
class Node:
    """A limiter on a fake clock; a fleet node syncs with `store` at every span end passed."""

    limiter: Limiter
    store: MemoryStorage | None = None
    store_down: bool = False
    now: int = T0
    synced: list[int] = field(default_factory=list)

    def hit(self, rule: Rule, at: int, hits: int = 1) -> Verdict:
        self._sync_until(at)
        self.now = at
        return self.limiter.hit(at, [Hit(rule, ("d", "k", "v"), hits)]).verdicts[0]

    def _sync_until(self, at: int) -> None:
        fleet = self.limiter
        if not isinstance(fleet, FleetLimiter) or self.store is None:
            return
        end = fleet.next_span_end(self.now)
        while end is not None and end <= at:
            batch = fleet.end_span(end)
            answer = None if self.store_down else self.store.execute(batch, "n1")
            fleet.apply_sync(end, batch, answer, resend=True)
            self.synced.append(end)
            end = fleet.next_span_end(end)


def fleet_node(live_nodes: int = 1) -> Node:
    clock = [T0]
    store = MemoryStorage(clock=lambda: clock[0])
    limiter = FleetLimiter(new_keys_alone=False)  # a new key guesses an even split
    limiter.live_nodes = live_nodes
    return Node(limiter, store)


def first_refusal(node: Node, rule: Rule, start: int, gap_ms: int = 1, hits: int = 1) -> Verdict:
    """Send `hits` every `gap_ms` from `start` until one is refused; that refusal."""
    at = start
    for _ in range(10_000):
        verdict = node.hit(rule, at, hits)
        if verdict.code is Code.OVER_LIMIT:
            return verdict
        at += gap_ms
    raise AssertionError("never refused")


def assert_admitted_after(node: Node, rule: Rule, verdict: Verdict, hits: int = 1) -> int:
    wait = verdict.reset_ms
    assert wait > 0
    retry = node.hit(rule, node.now + wait, hits)
    assert retry.code is Code.OK, f"refused again after the stated {wait} ms"
    return wait


def assert_tight(node: Node, rule: Rule, verdict: Verdict, hits: int = 1) -> None:
    """One millisecond before the stated wait the same request is still refused (so the wait
    is no longer than needed), and at the stated time it is admitted. For rules without a
    cooldown: an early retry must not start a block."""
    refused_at = node.now
    early = node.hit(rule, refused_at + verdict.reset_ms - 1, hits)
    assert early.code is Code.OVER_LIMIT
    node.now = refused_at
    assert_admitted_after(node, rule, verdict, hits)


# -- fixed window ----------------------------------------------------------------------------


def test_a_fresh_keys_first_refusal_on_the_estimate_waits_for_the_window_end() -> None:
    """The issue's case: a new key guesses 4 nodes, so each own hit stands for 4; its first
    refusal comes from the estimate alone (no block). The old answer, the span's end, was
    followed by a block at the next sync; the window's end is when a retry fits."""
    rule = make_rule(FIXED, 40, seconds=10, spans=5)
    node = fleet_node(live_nodes=4)
    refusal = first_refusal(node, rule, T0 + 1000, gap_ms=20)
    state = node.limiter.keys.get(("d", "k", "v"))
    assert state is not None and state.blocked_until == 0  # refused on the estimate alone
    assert refusal.reset_ms == T0 + 10_000 - node.now  # the window's end
    assert_admitted_after(node, rule, refusal)


def test_a_block_for_the_cooldown_states_its_end() -> None:
    rule = make_rule(FIXED, 5, spans=2)  # the default cooldown: one window from the crossing
    node = Node(LocalLimiter())
    first = first_refusal(node, rule, T0 + 100, gap_ms=10)
    blocked = node.hit(rule, node.now + 50)  # refused by the block itself now
    assert blocked.code is Code.OVER_LIMIT
    assert node.now + blocked.reset_ms == node.now - 50 + first.reset_ms  # one end for both
    assert_tight(node, rule, blocked)


def test_a_cooldown_shorter_than_the_window_waits_for_the_window_end() -> None:
    """The block ends before the window does, and the window is still full: a retry at the
    block's end would be refused (and blocked again)."""
    rule = make_rule(FIXED, 5, seconds=10, spans=5, cooldown_ms=500)
    node = Node(LocalLimiter())
    refusal = first_refusal(node, rule, T0 + 100, gap_ms=10)
    assert refusal.reset_ms == T0 + 10_000 - node.now
    assert_admitted_after(node, rule, refusal)


def test_a_fleet_block_from_the_stores_total_states_a_wait_that_is_admitted() -> None:
    rule = make_rule(FIXED, 20, seconds=10, spans=5)
    node = fleet_node(live_nodes=1)
    refusal = first_refusal(node, rule, T0 + 100, gap_ms=100)
    assert refusal.reset_ms <= rule.limits[0].cooldown
    assert_admitted_after(node, rule, refusal)


def test_the_fallback_block_while_the_store_is_down_states_a_wait_that_is_admitted() -> None:
    rule = make_rule(FIXED, 20, seconds=10, spans=5)
    node = fleet_node(live_nodes=2)
    node.store_down = True
    refusal = first_refusal(node, rule, T0 + 100, gap_ms=50)
    assert refusal.reset_ms <= max(rule.limits[0].cooldown, T0 + 10_000 - node.now)
    node.store_down = False
    assert_admitted_after(node, rule, refusal)


# -- the trailing windows and the bucket: exact on one node, so the wait is the shortest --------


def test_a_sliding_window_refusal_waits_exactly_until_the_request_fits() -> None:
    rule = make_rule(WINDOW, 10, spans=4)
    node = Node(LocalLimiter())
    refusal = first_refusal(node, rule, T0 + 100, gap_ms=30)
    assert refusal.reset_ms <= 1000
    assert_tight(node, rule, refusal)


def test_a_sliding_window_block_shorter_than_the_drain_waits_for_the_drain() -> None:
    rule = make_rule(WINDOW, 10, spans=4, cooldown_ms=100)
    node = Node(LocalLimiter())
    refusal = first_refusal(node, rule, T0 + 100, gap_ms=5)
    assert refusal.reset_ms > 100  # the block alone would have said 100
    assert refusal.reset_ms <= 1000 + 250  # a window and the span it is leaving, at most
    assert_admitted_after(node, rule, refusal)


def test_a_token_bucket_refusal_waits_exactly_for_the_tokens() -> None:
    rule = make_rule(BUCKET, 10, burst=5)
    node = Node(LocalLimiter())
    refusal = first_refusal(node, rule, T0 + 100, gap_ms=1, hits=2)
    assert refusal.reset_ms <= 2 * 100  # two tokens, one every 100 ms
    assert_tight(node, rule, refusal, hits=2)


def test_a_token_bucket_block_shorter_than_the_refill_waits_for_the_refill() -> None:
    rule = make_rule(BUCKET, 10, burst=5, cooldown_ms=20)
    node = Node(LocalLimiter())
    refusal = first_refusal(node, rule, T0 + 100, gap_ms=1, hits=3)
    assert 20 < refusal.reset_ms <= 3 * 100
    assert_admitted_after(node, rule, refusal, hits=3)


def test_a_sliding_log_refusal_waits_exactly_until_the_oldest_entries_leave() -> None:
    rule = make_rule(LOG, 10)
    node = Node(LocalLimiter())
    refusal = first_refusal(node, rule, T0 + 100, gap_ms=40, hits=3)
    assert refusal.reset_ms <= 1000
    assert_tight(node, rule, refusal, hits=3)


def test_a_sliding_log_block_shorter_than_the_drain_waits_for_the_drain() -> None:
    rule = make_rule(LOG, 10, cooldown_ms=50)
    node = Node(LocalLimiter())
    refusal = first_refusal(node, rule, T0 + 100, gap_ms=2)
    assert 50 < refusal.reset_ms <= 1000
    assert_admitted_after(node, rule, refusal)


def test_a_fleet_sliding_window_estimate_refusal_is_admitted_after_its_wait() -> None:
    rule = make_rule(WINDOW, 40, seconds=10, spans=5)
    node = fleet_node(live_nodes=2)
    refusal = first_refusal(node, rule, T0 + 1000, gap_ms=50)
    assert refusal.reset_ms <= 10_000 + 2000
    assert_admitted_after(node, rule, refusal)


def test_a_nearly_full_window_states_the_block_its_remaining_syncs_will_set() -> None:
    """The store has confirmed 5/6 of MAX and this node's estimate refuses: the fleet's other
    nodes still admit what their own estimates allow, the window most often ends over MAX, and
    every sync left in it re-arms the cooldown. The wait covers that block: here the store
    does say over MAX at every later span end, and the retry at the stated time is admitted,
    the block just over."""
    rule = make_rule(FIXED, 60, seconds=6, spans=6)  # 1 s spans, a 6 s cooldown
    limiter = FleetLimiter()
    limiter.live_nodes = 2
    key = Hit(rule, ("d", "k", "v"), 1)
    for i in range(25):
        assert limiter.hit(T0 + 100 + i, [key]).code is Code.OK
    sync_with_total(limiter, T0 + 1000, 50)  # the other node counted 25 too
    codes = [limiter.hit(T0 + 1100 + i, [key]).code for i in range(5)]
    assert codes == [Code.OK] * 5  # 50 + 5 x 2 = MAX: the sixth one is refused
    refused_at = T0 + 1105
    refusal = limiter.hit(refused_at, [key]).verdicts[0]
    assert refusal.code is Code.OVER_LIMIT
    assert refused_at + refusal.reset_ms == T0 + 5000 + 6000  # the last re-arm + cooldown
    for end in range(T0 + 2000, T0 + 6000, 1000):
        sync_with_total(limiter, end, 62)
    state = limiter.keys.get(key.key)
    assert state is not None and state.blocked_until == refused_at + refusal.reset_ms
    assert limiter.hit(refused_at + refusal.reset_ms, [key]).code is Code.OK


def sync_with_total(limiter: FleetLimiter, now: int, total: int) -> None:
    batch = limiter.end_span(now)
    answers = tuple(PushResult(total, 0) for _ in batch.pushes)
    limiter.apply_sync(now, batch, SyncResult(answers))


def test_a_blocked_sliding_window_recomputes_its_wait_when_the_store_adds_counts() -> None:
    """Under a block every refusal asks for the wait again; it is kept until the counts
    change: a store answer with more of the fleet's hits makes the wait longer."""
    rule = make_rule(WINDOW, 100, spans=4, cooldown_ms=100)
    limiter = FleetLimiter()
    limiter.live_nodes = 1
    key = Hit(rule, ("d", "k", "v"), 1)
    assert limiter.hit(T0 + 10, [Hit(rule, key.key, 100)]).code is Code.OK
    first = limiter.hit(T0 + 20, [key]).verdicts[0]  # over for sure: blocked 100 ms
    assert first.code is Code.OVER_LIMIT and first.reset_ms > 100
    assert limiter.hit(T0 + 30, [key]).verdicts[0].reset_ms == first.reset_ms - 10  # kept
    batch = limiter.end_span(T0 + 250)
    # The fleet counted 160 in span 0: this node's 100 and another node's 60.
    answer = PushResult(160, 0, spans=(0, 0, 0, 160))
    limiter.apply_sync(T0 + 250, batch, SyncResult((answer,)))
    later = limiter.hit(T0 + 260, [key]).verdicts[0]
    assert later.code is Code.OVER_LIMIT
    # 160 x (1249 - t) / 250 + 1 <= 100 from t = 1095 on (it was 1002 for 100)
    assert (first.reset_ms, later.reset_ms) == (1002 - 20, 1095 - 260)

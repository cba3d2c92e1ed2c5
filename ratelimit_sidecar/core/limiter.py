"""The request path of the core: decides requests from memory, for every key this node tracks.

Callers pass `now_ms` (epoch ms: nodes share windows by epoch ordinal) to every call. A span end
is the subclass's: `FleetLimiter` (core/fleet.py) pushes to a shared store, `LocalLimiter`
(core/local.py) applies the counts in memory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Rule
from ratelimit_sidecar.core.algorithm import Algorithm
from ratelimit_sidecar.core.evicted import EvictedCounts, lasting_windows
from ratelimit_sidecar.core.fixed_window import FixedWindow
from ratelimit_sidecar.core.keystate import KeyState, WindowCounts
from ratelimit_sidecar.core.keytable import KeyTable
from ratelimit_sidecar.core.penalty import PenaltyState, RaisedLevels
from ratelimit_sidecar.core.sliding_log import SlidingLog
from ratelimit_sidecar.core.sliding_window import SlidingWindow
from ratelimit_sidecar.core.spancounts import SpanState
from ratelimit_sidecar.core.spans import span_end
from ratelimit_sidecar.core.token_bucket import TokenBucket
from ratelimit_sidecar.core.types import OK, OVER_LIMIT, Decision, Hit, KeyId, Verdict
from ratelimit_sidecar.core.verdicts import deny_verdict, refuse_blocked, unlimited_verdict

DEFAULT_MAX_KEYS = 100_000
KEYS_PER_STEP = 2000  # keys a span end or a sweep visits between two yields to the event loop
Counter = KeyState | None  # a descriptor's counter; None: it has none (denied or unlimited)
# A checked descriptor: the verdict that refuses it (None: within its limit), and its counter.
Checked = tuple[Verdict | None, Counter]


class Limiter(ABC):
    def __init__(
        self,
        max_keys: int = DEFAULT_MAX_KEYS,
        *,
        fixed_window: FixedWindow | None = None,
        sliding_window: SlidingWindow | None = None,
        token_bucket: TokenBucket | None = None,
    ) -> None:
        # Global shadow mode is the service's (service/overall.py); a rule's is here.
        self.keys = KeyTable(max_keys)
        # Indexed by AlgorithmName; `fixed_window` replaces the shipped one (simulator variants).
        self.algorithms = all_algorithms(fixed_window, sliding_window, token_bucket)
        self._live_nodes = 1  # node-level estimate for keys without history
        self.dropped_hits = 0  # admitted hits that could never be pushed (cumulative)
        self.untracked = 0  # decisions made without a counter: the table was full of blocks
        self._schedules: set[tuple[int, int]] = set()  # (window_ms, spans) of tracked rules
        self._evicted_counts = EvictedCounts(max_keys)
        self.penalties = RaisedLevels()  # offences that raised a key's penalty level (cumulative)

    @property
    def live_nodes(self) -> int:
        """A property, as FleetLimiter's: compiled code reading a plain attribute here would not
        see that override."""
        return self._live_nodes

    @live_nodes.setter
    def live_nodes(self, nodes: int) -> None:
        self._live_nodes = nodes

    def hit(self, now_ms: int, hits: Sequence[Hit], refused: bool = False) -> Decision:
        """Counts only if every descriptor admits; `refused`: a strict limit refused it."""
        checked = [self._check_all(now_ms, hit) for hit in hits]
        over = any(_refuses(limits_checked) for limits_checked in checked)
        if not (over or refused):
            for index, hit in enumerate(hits):
                self._count_all(checked[index], hit.hits, now_ms)
        else:
            for index, hit in enumerate(hits):
                self._count_refused(checked[index], hit.hits, now_ms)
        verdicts = tuple([self._verdict(limits_checked, now_ms) for limits_checked in checked])
        return Decision(OVER_LIMIT if over else OK, verdicts)

    def check(  # noqa: PLR0917 - a descriptor's parts, as a compiled request keeps them
        self, now_ms: int, rule: Rule, limit: RateLimit, key: KeyId, hits: int, counter: Counter
    ) -> Checked:
        """One limit of a descriptor: the verdict that refuses `hits` (None: within the limit),
        and the key's counter (None: it has none). `counter`: what this returned for `key` last
        time, if the caller kept it (None: looked up); one the table has dropped since is not
        used."""
        if limit.requests_per_unit == 0:
            return deny_verdict(limit, hits, rule.shadow_mode), None
        state = counter if counter is not None and counter.tracked else self.keys.get(key)
        if state is None or state.limit is not limit:  # new, or its rule was reloaded
            state = self._state(rule, key, limit, now_ms, alone=True)
        algorithm = self.algorithms[limit.algorithm_index]
        if state is None:  # table full of blocked keys: decide on this request alone, as if
            self.untracked += 1  # on a key new to the node, whose counter is then dropped
            state = KeyState(key, rule, limit, now_ms, 1)
            algorithm.start(state, 0)
        elif now_ms >= state.next_sync:
            self._catch_up(state, now_ms)
        if now_ms < state.blocked_until:  # step 1 of every algorithm: the block's Retry-After
            wait = algorithm.wait_ms(state, hits, now_ms)  # is the algorithm's
            return refuse_blocked(state, hits, now_ms, wait), state
        if hits <= 0:  # a check without hits: nothing to refuse
            return None, state
        return algorithm.check(state, hits, now_ms), state

    def count_admitted(
        self, now_ms: int, hit: Hit, since_ms: int | None = None, *, edge_over_ms: int
    ) -> list[KeyState | None]:
        """An RLQS report's hits, counted whatever the limits say; those before a fixed window
        began in [`since_ms`, `now_ms`] (pro rata) are the previous window's. A limit keeps its
        `consistency: edge` (a strict one takes it too: no request waits on the store) only in a
        window longer than `edge_over_ms`; shorter ones count eventual (core/quota_assign.py,
        `QuotaPolicy.edge_over_ms`). Returns each limit's counter (None: a deny list, or no
        room)."""
        rule = hit.rule
        if rule is None:
            return []
        several = len(rule.limits) > 1
        states: list[KeyState | None] = []
        for index, limit in enumerate(rule.limits):
            key = limit_key(hit.key, index) if several else hit.key
            state = self._caught_up(rule, key, limit, now_ms) if limit.requests_per_unit else None
            if state is not None:
                state.edge = (limit.edge or limit.strict) and limit.window_ms > edge_over_ms
                self._count_reported(state, hit.hits, now_ms, since_ms)
            states.append(state)
        return states

    def lease_counter(self, now_ms: int, hit: Hit) -> KeyState | None:
        """The window counter an RLQS lease counts into (core/quota_lease.py), caught up;
        None without room. It is at the edge (its pushes fast, the others' heard): leases are
        counted before they are spent."""
        rule = hit.rule
        assert rule is not None and len(rule.limits) == 1
        state = self._caught_up(rule, hit.key, rule.limits[0], now_ms)
        if state is not None:
            state.edge = True
        return state

    def _caught_up(self, rule: Rule, key: KeyId, limit: RateLimit, now_ms: int) -> KeyState | None:
        """An RLQS counter, made if new, its span ends caught up; None without room."""
        state = self._state(rule, key, limit, now_ms)
        if state is not None and now_ms >= state.next_sync:
            self._catch_up(state, now_ms)
        return state

    def count_lease(self, state: KeyState, hits: int, now_ms: int) -> None:
        """Leased tokens counted (negative: given back), pushed at once."""
        self._leased(state).count_leased(state, hits, now_ms)

    def owe_lease(self, state: KeyState, bucket: int, tokens: int, now_ms: int) -> None:
        """What an RLQS bucket's lease holds counted and not reported spent: a trailing window
        keeps it in its current span (core/spancounts.py, `LeasedSpans`)."""
        counts = state.counts
        if isinstance(counts, SpanState) and counts.leased is not None:
            counts.leased.owe(bucket, tokens, now_ms)

    def leased_count(self, state: KeyState, now_ms: int) -> int:
        """What a leased counter holds now, leases included (a window's, or a trailing one's)."""
        algorithm = self._leased(state)
        if isinstance(algorithm, SlidingWindow):
            return algorithm.known_count(state, now_ms)
        return algorithm.window_count(state)

    def _leased(self, state: KeyState) -> FixedWindow | SlidingWindow:
        algorithm = self.algorithms[state.limit.algorithm_index]
        assert isinstance(algorithm, FixedWindow | SlidingWindow)
        return algorithm

    def _count_reported(
        self, state: KeyState, hits: int, now_ms: int, since_ms: int | None
    ) -> None:
        limit = state.limit
        late = 0
        start = now_ms - now_ms % limit.window_ms
        fixed = limit.algorithm is AlgorithmName.FIXED_WINDOW
        if fixed and hits > 0 and since_ms is not None and since_ms < start < now_ms:
            late = hits * (start - since_ms) // (now_ms - since_ms)
            self._count_late(state, late)
        algorithm = self.algorithms[limit.algorithm_index]
        if hits - late:
            algorithm.count(state, hits - late, now_ms)
        if state.edge and isinstance(algorithm, FixedWindow):
            algorithm.reported(state, now_ms)

    def _check_all(self, now_ms: int, hit: Hit) -> list[Checked]:
        rule = hit.rule
        if rule is None or rule.limit is None:
            return [(unlimited_verdict(rule), None)]
        if len(rule.limits) < 2:
            return [self.check(now_ms, rule, rule.limit, hit.key, hit.hits, None)]
        return [
            self.check(now_ms, rule, limit, limit_key(hit.key, index), hit.hits, None)
            for index, limit in enumerate(rule.limits)
        ]

    def _count_all(self, limits_checked: list[Checked], hits: int, now_ms: int) -> None:
        for _, state in limits_checked:
            if state is not None and hits:
                self.algorithm_of(state).count(state, hits, now_ms)

    def _count_refused(self, limits_checked: list[Checked], hits: int, now_ms: int) -> None:
        """`count_refused` limits count a refused request's hits (a cost already spent)."""
        for _, state in limits_checked:
            if state is not None and hits > 0 and state.limit.count_refused and state.tracked:
                self.algorithm_of(state).count(state, hits, now_ms)

    def _verdict(self, limits_checked: list[Checked], now_ms: int) -> Verdict:
        """Of several limits: the refusal with the longest wait, else the fewest remaining."""
        if len(limits_checked) == 1:
            verdict, state = limits_checked[0]
            if verdict is None and state is not None:
                return self.algorithm_of(state).admitted(state, now_ms)
            assert verdict is not None  # a descriptor without a counter has its verdict
            return verdict
        refusals = [v for v, _ in limits_checked if v is not None]
        if refusals:
            return max(refusals, key=refusal_order)
        verdicts = [self._verdict([checked], now_ms) for checked in limits_checked]
        return min(verdicts, key=lambda verdict: verdict.remaining)

    def _state(
        self, rule: Rule, key: KeyId, limit: RateLimit, now_ms: int, alone: bool = False
    ) -> KeyState | None:
        """Made if new; None without room. `alone`: for a request (not an RLQS report)."""
        state = self.keys.get(key)
        if state is not None and state.limit is limit:
            return state
        if state is not None and same_counting(state.limit, limit):  # keep the counts
            if lifts_block(state.limit.requests_per_unit, limit):
                state.blocked_until = 0  # a raised limit applies to the window's count so far
            if limit.penalty != state.limit.penalty:  # its levels meant the old penalty's blocks
                state.penalty = (
                    None if limit.penalty is None else PenaltyState(limit.penalty, self.penalties)
                )
            state.limit, state.rule = limit, rule
            if isinstance(state.counts, WindowCounts):  # a lenient ceiling was the old MAX's
                state.counts.ceiling = float(limit.requests_per_unit)
            return state
        nodes = self._new_key_nodes(limit, alone)
        new_state = KeyState(key, rule, limit, now_ms, nodes, raised=self.penalties)
        if state is not None:  # the rule changed under a reload: start over
            self._evicted(state)
            self.keys.remove(state)
        evicted = self.keys.insert(new_state, now_ms)
        if evicted is None:
            return None
        # Read before the victims are recorded: their records may take the place of this one.
        resumed = self._evicted_counts.estimate(new_state.key, limit, new_state.window)
        self.algorithms[limit.algorithm_index].start(new_state, resumed)
        self._started(new_state)
        for victim in evicted:  # its count is kept: coming back cannot reset it (core/evicted.py)
            old = victim.limit
            if now_ms // old.window_ms - victim.window <= lasting_windows(old):
                count = self.algorithms[old.algorithm_index].window_count(victim)
                self._evicted_counts.record(victim.key, old, count, now_ms)
            self._evicted(victim)
        self._schedules.add((limit.window_ms, limit.spans))
        return new_state

    def _new_key_nodes(self, limit: RateLimit, alone: bool) -> float:  # noqa: ARG002
        """An even split; an int as it is: one object every new key shares, not a float each."""
        return self.live_nodes

    # Hooks: a new key started; its span ended since last looked at; RLQS hits reported after
    # its window moved on (the previous window's); it leaves the table (evicted, or rule changed).
    def _started(self, state: KeyState) -> None:  # noqa: B027 - optional, empty by default
        ...

    @abstractmethod
    def _catch_up(self, state: KeyState, now_ms: int) -> None: ...

    @abstractmethod
    def _count_late(self, state: KeyState, hits: int) -> None: ...

    @abstractmethod
    def _evicted(self, state: KeyState) -> None: ...

    def shortest_span_ms(self) -> int | None:
        """Sync timeouts must fit in half of it."""
        return min((w // n for w, n in self._schedules), default=None)

    def next_span_end(self, now_ms: int) -> int | None:
        if not self._schedules:
            return None
        return min(span_end(now_ms, w, n) for w, n in self._schedules)

    def blocked_keys(self, now_ms: int) -> int:
        return sum(1 for state in self.keys if now_ms < state.blocked_until)

    def penalty_levels(self, now_ms: int) -> dict[int, int]:
        levels: dict[int, int] = {}
        for state in self.keys:
            penalty = state.penalty
            if penalty is not None and penalty.current_level(now_ms):
                levels[penalty.level] = levels.get(penalty.level, 0) + 1
        return levels

    def algorithm_of(self, state: KeyState) -> Algorithm:
        return self.algorithms[state.limit.algorithm_index]


def all_algorithms(
    fixed_window: FixedWindow | None = None,
    sliding_window: SlidingWindow | None = None,
    token_bucket: TokenBucket | None = None,
) -> tuple[Algorithm, ...]:
    chosen: dict[AlgorithmName, Algorithm] = {
        AlgorithmName.FIXED_WINDOW: fixed_window or FixedWindow(),
        AlgorithmName.SLIDING_WINDOW: sliding_window or SlidingWindow(),
        AlgorithmName.TOKEN_BUCKET: token_bucket or TokenBucket(),
        AlgorithmName.SLIDING_LOG: SlidingLog(),
    }
    return tuple(chosen[name] for name in AlgorithmName)


_SUMMED = (AlgorithmName.FIXED_WINDOW, AlgorithmName.SLIDING_WINDOW)


def lifts_block(set_for: int, limit: RateLimit) -> bool:
    """A block started under `set_for` requests per unit no longer holds: `limit` was raised since
    (nodes lift or ignore it, the store deletes it). 0 (not known: an older sender's) holds."""
    return 0 < set_for < limit.requests_per_unit


def same_counting(old: RateLimit, new: RateLimit) -> bool:
    """The same rule, or only its number changed, keeps the counts: only the windows count plain
    sums (a bucket's ticks follow its rate, a log is sized by its limit)."""
    if old == new:
        return True
    return (
        old.algorithm is new.algorithm
        and old.algorithm in _SUMMED
        and old.window_ms == new.window_ms
        and old.spans == new.spans
        and old.strict == new.strict
        and new.requests_per_unit > 0
    )


def limit_key(key: KeyId, index: int) -> KeyId:
    """The counter of a descriptor's `index`-th limit (`rate_limits`)."""
    return (*key, "#limit", str(index))


def _refuses(limits_checked: list[Checked]) -> bool:
    """A limit of the descriptor refuses it (shadow mode's refusals admit)."""
    return any(v is not None and v.code is OVER_LIMIT for v, _ in limits_checked)


def refusal_order(verdict: Verdict) -> tuple[bool, int]:
    """An enforced refusal before a shadowed one; then the longer wait."""
    return (verdict.code is OVER_LIMIT, verdict.reset_ms)

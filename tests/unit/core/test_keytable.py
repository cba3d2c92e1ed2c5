"""Which key makes room when the table is full (fake clock, no limiter)."""

from __future__ import annotations

from ratelimit_sidecar.config.model import RateLimit, Rule, Unit
from ratelimit_sidecar.core import LocalLimiter
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.keytable import EVICTION_PROBES, KeyTable
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000
LIMIT = RateLimit(10, Unit.SECOND)  # 1 s windows
RULE = Rule("d", (("k", ""),), LIMIT)


def state(name: str, last_hit: int, blocked_until: int = 0) -> KeyState:
    found = KeyState(("d", "k", name), RULE, LIMIT, last_hit, 1.0)
    found.blocked_until = blocked_until
    return found


def keys(table: KeyTable) -> list[str]:
    return [s.key[2] for s in table]


def test_an_old_key_hit_in_its_window_gets_a_second_chance() -> None:
    table = KeyTable(3)
    for name, last_hit in (("busy", T0 + 900), ("idle", T0), ("new", T0 + 950)):
        table.insert(state(name, last_hit), T0)
    evicted = table.insert(state("next", T0 + 1000), T0 + 1000)
    assert evicted is not None
    assert [s.key[2] for s in evicted] == ["idle"]
    assert keys(table) == ["new", "busy", "next"]  # "busy" was looked at: moved back


def test_when_every_probed_key_is_busy_the_oldest_unblocked_one_goes() -> None:
    table = KeyTable(3)
    table.insert(state("blocked", T0, blocked_until=T0 + 5000), T0)
    table.insert(state("a", T0 + 10), T0)
    table.insert(state("b", T0 + 20), T0)
    evicted = table.insert(state("c", T0 + 30), T0 + 30)
    assert evicted is not None
    assert [s.key[2] for s in evicted] == ["a"]
    assert keys(table) == ["blocked", "b", "c"]


def test_blocked_keys_fill_the_probes_then_nothing_is_evicted() -> None:
    table = KeyTable(EVICTION_PROBES)
    for i in range(EVICTION_PROBES):
        table.insert(state(f"b{i}", T0, blocked_until=T0 + 5000), T0)
    assert table.insert(state("new", T0), T0 + 10) is None
    assert len(table) == EVICTION_PROBES


def test_eviction_keeps_finding_the_oldest_after_many_evictions() -> None:
    """Each insertion into a full table evicts the oldest idle key, in insertion order, however
    many were evicted before it (a plain dict would scan past every deleted entry)."""
    table = KeyTable(100)
    for i in range(100):
        table.insert(state(f"k{i}", T0 + i), T0 + i)
    for i in range(1000):
        now = T0 + 10_000 + 1000 * i  # every key but the one inserted now is idle
        evicted = table.insert(state(f"n{i}", now), now)
        assert evicted is not None
        assert evicted[0].key[2] == (f"k{i}" if i < 100 else f"n{i - 100}")
    assert table.evictions == 1000
    assert len(table) == 100


def test_removing_a_stale_state_leaves_its_key_tracked_anew_alone() -> None:
    """A span end or a sweep works in slices: a state it holds may have been evicted, and its
    key tracked by a new state, in between; forgetting the old one must not drop the new."""
    table = KeyTable(1)
    old = state("k", T0)
    table.insert(old, T0)
    table.insert(state("other", T0 + 2000), T0 + 2000)  # evicts "k" (idle)
    new = state("k", T0 + 4000)
    table.insert(new, T0 + 4000)  # evicts "other", tracks "k" anew
    table.remove(old)
    assert table.get(("d", "k", "k")) is new
    table.remove(new)
    assert len(table) == 0


def test_a_state_is_tracked_from_its_insertion_until_its_eviction_or_removal() -> None:
    """What a caller holding a state (the handler's compiled request) reads to trust it."""
    table = KeyTable(1)
    first, second, third = state("a", T0), state("b", T0 + 2000), state("c", T0 + 4000)
    assert not first.tracked
    table.insert(first, T0)
    assert first.tracked
    table.insert(second, T0 + 2000)  # evicts "a" (idle)
    assert (first.tracked, second.tracked) == (False, True)
    table.remove(second)
    table.remove(first)  # no longer in the table: nothing changes
    table.insert(third, T0 + 4000)
    assert (first.tracked, second.tracked, third.tracked) == (False, False, True)


def test_a_counter_handed_back_after_its_key_was_forgotten_is_not_used() -> None:
    """The fast path hands `Limiter.check` the counter it returned last; once a sweep forgot the
    key, the decision is the table's again, on a new counter that is tracked."""
    limiter, r = LocalLimiter(), rule(rpu=5)
    assert r.limit is not None
    request = hit(r, "v")
    _, kept = limiter.check(T0, r, r.limit, request.key, 1, None)
    assert kept is not None and kept is limiter.keys.get(request.key)
    limiter.algorithm_of(kept).count(kept, 1, T0)
    limiter.sweep(T0 + 120_000)
    assert len(limiter.keys) == 0
    verdict, again = limiter.check(T0 + 120_000, r, r.limit, request.key, 1, kept)
    assert verdict is None and again is not None and again is not kept
    assert again is limiter.keys.get(request.key)
    assert kept.nodes.admitted == 1 and again.nodes.admitted == 0


def test_local_sweep_in_slices_yields_and_forgets_idle_keys() -> None:
    limiter, r = LocalLimiter(), rule(rpu=5)
    for i in range(5):
        limiter.hit(T0, [hit(r, f"v{i}")])
    steps = list(limiter.sweep_steps(T0 + 120_000, keys_per_step=2))
    assert steps == [2, 4] and len(limiter.keys) == 0

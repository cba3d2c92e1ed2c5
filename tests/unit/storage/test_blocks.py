"""The blocks channel's message and the digest index beside the key table."""

from __future__ import annotations

import asyncio

from ratelimit_sidecar.core import Code, FleetLimiter
from ratelimit_sidecar.core.keystate import KeyState
from ratelimit_sidecar.core.keytable import KeyTable
from ratelimit_sidecar.core.types import KeyId
from ratelimit_sidecar.storage.blocks import (
    MAX_CATCH_UP,
    STALE_SLACK,
    BlockNotice,
    DigestIndex,
    parse_notice,
)
from ratelimit_sidecar.storage.keys import digest
from ratelimit_sidecar.sync.fleet_blocks import FleetBlocks
from tests.unit.core.rules import hit, rule

T0 = 1_700_000_040_000
D = "0123456789abcdef"


def notice_message(notice: BlockNotice) -> bytes:
    """What the scripts publish for `notice` (sync_common.lua `start_block`)."""
    return f"{notice.digest}|{notice.left_ms}|{notice.level}|{notice.set_for}".encode("ascii")


def test_a_notice_is_read_and_later_fields_are_ignored() -> None:
    assert parse_notice(b"0123456789abcdef|1500|2") == BlockNotice(D, 1500, 2, 0)
    assert parse_notice(b"0123456789abcdef|1500|0|30|x") == BlockNotice(D, 1500, 0, 30)
    assert parse_notice(notice_message(BlockNotice(D, 7, 1, 5))) == BlockNotice(D, 7, 1, 5)
    assert parse_notice(b"0123456789abcdef|1500|0|-3") is None
    assert parse_notice(b"0123456789abcdef|1500|0|x") is None


def test_anything_else_is_not_a_notice() -> None:
    for data in (
        b"",
        b"0123456789abcdef|1500",  # no level
        b"0123456789abcdeg|1500|0",  # not hex
        b"0x23456789abcdef|1500|0",
        b"0123456789ABCDEF|1500|0",  # digests are lower case
        b"0123456789abcde|1500|0",  # too short
        b"0123456789abcdef|0|0",  # an empty block
        b"0123456789abcdef|-5|0",
        b"0123456789abcdef|10|-1",
        b"0123456789abcdef|ten|0",
        b"\xff" * 16 + b"|10|0",
        b"0123456789abcdef|10|0|" + b"x" * 300,
    ):
        assert parse_notice(data) is None, data


def table_with(keys: list[KeyId], max_keys: int = 100) -> KeyTable:
    table = KeyTable(max_keys)
    for key in keys:
        table.insert(KeyState(key, rule(), rule().limit, T0, 1), T0)  # type: ignore[arg-type]
    return table


def counting(calls: list[KeyId]) -> object:
    def name(key: KeyId) -> str:
        calls.append(key)
        return digest(key)

    return name


def test_the_index_hashes_each_key_about_once() -> None:
    keys: list[KeyId] = [("d", "k", str(i)) for i in range(50)]
    table, calls = table_with(keys), list[KeyId]()
    index = DigestIndex(table, counting(calls))  # type: ignore[arg-type]
    assert index.find(digest(keys[3])) == keys[3]
    assert len(calls) == 50
    assert index.find(digest(("d", "k", "untracked"))) is None  # table unchanged: no work
    assert index.find(digest(keys[40])) == keys[40]
    assert len(calls) == 50
    more: list[KeyId] = [("d", "k", f"new{i}") for i in range(5)]
    for key in more:
        table.insert(KeyState(key, rule(), rule().limit, T0, 1), T0)  # type: ignore[arg-type]
    assert index.find(digest(more[0])) == more[0]
    assert len(calls) == 55  # only the five new keys, newest first


def test_a_key_that_left_the_table_is_not_found_and_stale_entries_are_bounded() -> None:
    keys: list[KeyId] = [("d", "k", str(i)) for i in range(10)]
    table = table_with(keys, max_keys=10)
    index = DigestIndex(table)
    assert index.find(digest(keys[0])) == keys[0]
    state = table.get(keys[0])
    assert state is not None
    table.remove(state)
    assert index.find(digest(keys[0])) is None
    # A flood of new keys through a small table: the index never holds much more than it.
    rebuilds = 0
    for i in range(3 * STALE_SLACK):
        flood = ("d", "k", f"flood{i}")
        table.insert(KeyState(flood, rule(), rule().limit, T0 + 2000, 1), T0 + 2000)  # type: ignore[arg-type]
        if index.find(digest(flood)) is None:
            assert index.rebuild_wanted
            rebuilds += 1
            for _ in index.rebuild_steps():
                pass
            assert not index.rebuild_wanted
            assert index.find(digest(flood)) == flood
        assert len(index) <= 2 * len(table) + STALE_SLACK + 1
    assert 1 <= rebuilds <= 3


def test_a_long_quiet_spell_is_caught_up_in_slices() -> None:
    keys: list[KeyId] = [("d", "k", str(i)) for i in range(4 * MAX_CATCH_UP + 1)]
    table = table_with(keys, max_keys=len(keys))
    index = DigestIndex(table)
    assert index.find(digest(keys[0])) is None  # too many to hash in one lookup
    assert index.rebuild_wanted
    steps = list(index.rebuild_steps(keys_per_step=MAX_CATCH_UP))
    assert steps == [MAX_CATCH_UP * n for n in (1, 2, 3, 4)]
    assert index.find(digest(keys[0])) == keys[0] and not index.rebuild_wanted


def test_fleet_blocks_rebuild_the_index_beside_requests() -> None:
    limiter, r = FleetLimiter(), rule(rpu=100)
    for i in range(4 * MAX_CATCH_UP + 1):
        limiter.hit(T0, [hit(r, value=str(i))])
    blocks = FleetBlocks(limiter, lambda: T0 + 5)
    first, second = (
        notice_message(BlockNotice(digest(hit(r, str(i)).key), 900, 0)) for i in (1, 2)
    )

    async def run() -> None:
        blocks.handle(first)  # not indexed yet: kept while the table is indexed in slices
        assert blocks.applied == 0
        for _ in range(20):
            await asyncio.sleep(0)
        assert blocks.applied == 1  # applied once indexed
        blocks.handle(second)

    asyncio.run(run())
    assert (blocks.received, blocks.applied) == (2, 2)
    for value in ("1", "2"):
        assert limiter.hit(T0 + 10, [hit(r, value=value)]).code is Code.OVER_LIMIT
    assert limiter.hit(T0 + 10, [hit(r, value="3")]).code is Code.OK


def test_fleet_blocks_apply_a_notice_to_the_named_key() -> None:
    limiter, r, now = FleetLimiter(), rule(rpu=100), [T0]
    blocks = FleetBlocks(limiter, lambda: now[0])
    limiter.hit(T0, [hit(r)])
    now[0] = T0 + 5
    blocks.handle(notice_message(BlockNotice(digest(hit(r).key), 1000, 0)))
    blocks.handle(notice_message(BlockNotice(digest(("d", "k", "other")), 1000, 0)))
    blocks.handle(b"garbage")
    assert (blocks.received, blocks.applied, blocks.malformed) == (2, 1, 1)
    verdict = limiter.hit(T0 + 10, [hit(r)]).verdicts[0]
    assert (verdict.code, verdict.reset_ms) == (Code.OVER_LIMIT, 995)

"""The Redis sync codec: what a batch becomes on the wire, and how replies become a result."""

from __future__ import annotations

from typing import Any

import pytest
from redis.crc import key_slot
from redis.exceptions import ResponseError

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Unit
from ratelimit_sidecar.core.types import KeyId, Push, SyncBatch, TotalRead
from ratelimit_sidecar.storage.codec import CHUNK_KEYS, HEARTBEAT, Layout, SyncCodec
from ratelimit_sidecar.storage.errors import StoreUnreadable
from ratelimit_sidecar.storage.keys import KeySchema, digest

LIMIT = RateLimit(requests_per_unit=10, unit=Unit.MINUTE, cooldown_ms=5000)
W = 29_000_000
NOW = 1_700_000_000_000
STORE_TIME_MS = 1_700_000_000_123
KEYS = KeySchema("t:")


def codec(cluster: bool = False, node_id: str = "node-a", node_ttl_ms: int = 30_000) -> SyncCodec:
    return SyncCodec(KEYS, cluster=cluster, node_id=node_id, node_ttl_ms=node_ttl_ms)


def push(key: KeyId, count: int = 1) -> Push:
    return Push(key, W, count, LIMIT)


def batch(pushes: int = 0, totals: int = 0) -> SyncBatch:
    return SyncBatch(
        NOW,
        [push(("d", "u", str(i)), i + 1) for i in range(pushes)],
        [TotalRead(("d", "u", str(i)), W - 1) for i in range(totals)],
    )


def answer(*pairs: tuple[int, int]) -> bytes:
    """A sync.lua reply: "total,left;total,left;..."."""
    return ";".join(f"{total},{left}" for total, left in pairs).encode()


def fixed_layout(
    *, pushes: int, chunks: tuple[tuple[int, ...], ...], total_reads: int, heartbeat: bool
) -> Layout:
    """The layout of a batch of fixed window pushes only."""
    scripts = (AlgorithmName.FIXED_WINDOW,) * len(chunks)
    return Layout(pushes, chunks, total_reads, heartbeat, scripts)


def heartbeat(live: Any = 1) -> list[Any]:
    """The heartbeat script's answer: the live count, then Redis TIME's seconds and µs."""
    return [live, b"1700000000", b"123456"]


# --- encoding -----------------------------------------------------------------------------------


def test_pushes_are_chunked_in_batch_order_on_standalone() -> None:
    encoded = codec().encode(batch(pushes=2 * CHUNK_KEYS + 500))
    assert [len(c) for c in encoded.layout.chunks] == [CHUNK_KEYS, CHUNK_KEYS, 500]
    flat = [i for chunk in encoded.layout.chunks for i in chunk]
    assert flat == list(range(2 * CHUNK_KEYS + 500))
    assert len(encoded.script_args) == encoded.layout.script_calls == 3


def test_script_arguments_pack_one_entry_per_push() -> None:
    key = ("gw", "api_key", "secret-value")
    alone = push(("gw", "ip", "1.2.3.4"), -2)._replace(announce=True)
    encoded = codec().encode(SyncBatch(NOW, [push(key, 3), alone]))
    numkeys, route, prefix, packed, *_channels = encoded.script_args[0]
    assert (numkeys, route, prefix) == (1, KEYS.counter(key, W), "t:")
    entries = packed.split(";")
    assert entries[0] == f"{digest(key)}|:gw:api_key:{W}|3|120000|10|5000|0|"  # no penalty: empty
    assert entries[1].split("|")[2::4] == ["-2", "1"]
    assert "secret-value" not in packed


def test_commands_follow_the_scripts_reads_then_the_heartbeat() -> None:
    encoded = codec(node_ttl_ms=20_000).encode(batch(pushes=1, totals=2))
    assert list(encoded.commands) == [
        ("GET", KEYS.counter(("d", "u", "0"), W - 1)),
        ("GET", KEYS.counter(("d", "u", "1"), W - 1)),
        ("EVAL", HEARTBEAT.source, 1, KEYS.nodes(), "node-a", NOW, 20_000),
    ]
    assert encoded.layout == fixed_layout(pushes=1, chunks=((0,),), total_reads=2, heartbeat=True)
    assert encoded.layout.replies == 1 + 2 + 1


@pytest.mark.parametrize(("node_id", "ttl"), [("", 30_000), ("node-a", 0)])
def test_no_heartbeat_without_a_node_id_or_a_ttl(node_id: str, ttl: int) -> None:
    encoded = codec(node_id=node_id, node_ttl_ms=ttl).encode(batch(pushes=1))
    assert list(encoded.commands) == []
    assert not encoded.layout.heartbeat and encoded.layout.replies == 1


def test_a_batch_between_heartbeats_sends_only_its_pushes_and_reads() -> None:
    quiet = SyncBatch(NOW, batch(pushes=1).pushes, heartbeat=False)
    encoded = codec().encode(quiet)
    assert list(encoded.commands) == [] and encoded.layout.replies == 1


def test_an_empty_batch_still_beats() -> None:
    encoded = codec().encode(SyncBatch(NOW))
    assert encoded.layout.chunks == () and encoded.script_args == ()
    assert [c[0] for c in encoded.commands] == ["EVAL"]


def test_cluster_calls_touch_one_slot_each_and_cover_every_push() -> None:
    encoded = codec(cluster=True).encode(batch(pushes=3000))
    pushes = batch(pushes=3000).pushes
    slots_per_call = [
        {key_slot(KEYS.tag(pushes[i].key).encode()) for i in chunk}
        for chunk in encoded.layout.chunks
    ]
    assert all(len(slots) == 1 for slots in slots_per_call)
    assert sorted(i for chunk in encoded.layout.chunks for i in chunk) == list(range(3000))
    for chunk, args in zip(encoded.layout.chunks, encoded.script_args, strict=True):
        assert chunk == tuple(sorted(chunk))  # batch order within a slot
        assert key_slot(args[1].encode()) == key_slot(KEYS.tag(pushes[chunk[0]].key).encode())


def test_a_crowded_cluster_slot_is_still_cut_into_chunks() -> None:
    # One key id in many windows: every push shares the key's slot.
    pushes = [Push(("d", "u", "hot"), W + i, 1, LIMIT) for i in range(CHUNK_KEYS + 1)]
    encoded = codec(cluster=True).encode(SyncBatch(NOW, pushes))
    assert [len(c) for c in encoded.layout.chunks] == [CHUNK_KEYS, 1]


def test_the_heartbeat_is_routed_by_the_node_set_on_cluster() -> None:
    encoded = codec(cluster=True).encode(SyncBatch(NOW))
    assert encoded.routing_keys() == {KEYS.nodes()}


# --- decoding -----------------------------------------------------------------------------------


def test_replies_are_read_back_by_what_they_answer() -> None:
    layout = fixed_layout(pushes=3, chunks=((0, 2), (1,)), total_reads=2, heartbeat=True)
    replies = [answer((5, 0), (12, 4000)), answer((7, 0)), b"40", None, heartbeat(3)]
    result = codec().decode(layout, replies)
    assert [(p.total, p.block_ms) for p in result.pushes] == [(5, 0), (7, 0), (12, 4000)]
    assert result.totals == (40, 0)  # a gone window (None) reads 0
    assert result.live_nodes == 3
    assert result.store_time_ms == STORE_TIME_MS


def test_without_a_heartbeat_the_clock_and_live_count_are_unknown() -> None:
    layout = fixed_layout(pushes=1, chunks=((0,),), total_reads=0, heartbeat=False)
    result = codec().decode(layout, [answer((1, 0))])
    assert (result.store_time_ms, result.live_nodes, result.heartbeat_error) == (0, 0, "")


@pytest.mark.parametrize("left", [-1, -2])
def test_a_negative_block_time_reads_as_not_blocked(left: int) -> None:
    # -1: a flag without TTL (never written by the script); -2: no flag. Neither may block.
    layout = fixed_layout(pushes=1, chunks=((0,),), total_reads=0, heartbeat=False)
    result = codec().decode(layout, [f"3,{left}"])
    assert [(p.total, p.block_ms) for p in result.pushes] == [(3, 0)]


@pytest.mark.parametrize("extra", [-1, 1])
def test_a_wrong_number_of_replies_is_refused(extra: int) -> None:
    layout = fixed_layout(pushes=1, chunks=((0,),), total_reads=1, heartbeat=True)
    replies = [answer((1, 0)), b"2", heartbeat(), 0][: layout.replies + extra]
    with pytest.raises(StoreUnreadable, match="replies for 3 commands"):
        codec().decode(layout, replies)


@pytest.mark.parametrize(
    "script_reply",
    [
        answer((1, 0)),  # one answer for two keys
        answer((1, 0), (2, 0), (3, 0)),  # three for two
        b"",  # none
        b"1,0;2",  # an answer without its block time
        b"1,0;x,0",  # not a number
        b"1,0;2,0,0",  # one field too many
        42,  # not text at all
        None,
    ],
)
def test_a_malformed_script_answer_may_have_been_applied(script_reply: Any) -> None:
    layout = fixed_layout(pushes=2, chunks=((0, 1),), total_reads=0, heartbeat=False)
    with pytest.raises(StoreUnreadable) as raised:
        codec().decode(layout, [script_reply])
    assert raised.value.may_have_applied  # the script ran: what it applied is unknown


def test_a_key_the_script_could_not_count_fails_alone() -> None:
    layout = fixed_layout(pushes=3, chunks=((0, 1, 2),), total_reads=0, heartbeat=False)
    reply = b"4,0;E:WRONGTYPE Operation against a key holding the wrong kind of value;6,900"
    result = codec().decode(layout, [reply])
    assert [(p.total, p.block_ms, p.error) for p in result.pushes] == [
        (4, 0, ""),
        (0, 0, "WRONGTYPE Operation against a key holding the wrong kind of value"),
        (6, 900, ""),
    ]


def test_a_script_call_answered_with_an_error_fails_only_its_own_keys() -> None:
    layout = fixed_layout(pushes=3, chunks=((0, 2), (1,)), total_reads=0, heartbeat=False)
    refused = ResponseError("READONLY You can't write\nagainst a read only replica.")
    result = codec().decode(layout, [refused, answer((7, 0))])
    errors = [p.error for p in result.pushes]
    assert errors == [errors[0], "", errors[0]]
    assert errors[0].startswith("READONLY") and "\n" not in errors[0]
    assert result.pushes[1].total == 7


@pytest.mark.parametrize(
    ("total", "beat"),
    [
        (b"many", heartbeat()),
        (ResponseError("WRONGTYPE"), heartbeat()),
        (b"1", None),
        (b"1", ResponseError("WRONGTYPE Operation against a key holding the wrong kind")),
        (b"1", [1, 2]),
        (b"1", [b"some", b"1700000000", b"123456"]),
    ],
)
def test_a_failed_read_or_heartbeat_is_unknown_not_a_failure(total: Any, beat: Any) -> None:
    layout = fixed_layout(pushes=0, chunks=(), total_reads=1, heartbeat=True)
    result = codec().decode(layout, [total, beat])
    # Each value that failed reads as unknown (0), and a failed heartbeat says why.
    beat_ok = beat == heartbeat()
    expected = (1 if total == b"1" else 0, STORE_TIME_MS if beat_ok else 0, int(beat_ok))
    assert (result.totals[0], result.store_time_ms, result.live_nodes) == expected
    assert bool(result.heartbeat_error) is not beat_ok


def test_chunks_that_miss_a_push_are_unreadable() -> None:
    layout = fixed_layout(pushes=2, chunks=((0,),), total_reads=0, heartbeat=False)
    with pytest.raises(StoreUnreadable, match="every push"):
        codec().decode(layout, [answer((1, 0))])


def test_encode_and_decode_agree_on_the_layout() -> None:
    sync = codec(cluster=True)
    encoded = sync.encode(batch(pushes=2500, totals=3))
    scripts = [answer(*[(i + 1, 0) for i in chunk]) for chunk in encoded.layout.chunks]
    result = sync.decode(encoded.layout, [*scripts, b"1", b"2", None, heartbeat(2)])
    assert [p.total for p in result.pushes] == list(range(1, 2501))
    assert (result.totals, result.live_nodes) == ((1, 2, 0), 2)


def test_the_routing_keys_are_those_each_command_is_sent_by() -> None:
    encoded = codec(cluster=True).encode(batch(pushes=2, totals=1))
    first, second = ("d", "u", "0"), ("d", "u", "1")
    assert encoded.routing_keys() == {
        KEYS.counter(first, W),
        KEYS.counter(second, W),
        KEYS.counter(first, W - 1),
        KEYS.nodes(),
    }

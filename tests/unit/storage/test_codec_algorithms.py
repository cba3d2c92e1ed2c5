"""The sync codec for the sliding window and token bucket: entries per algorithm, one script and
one slot per call, span totals read back, sliding log pushes never sent. Pure: no Redis."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Unit
from ratelimit_sidecar.core.types import KeyId, Push, PushResult, SyncBatch
from ratelimit_sidecar.storage.codec import CHUNK_KEYS, UNSYNCABLE, Layout, SyncCodec
from ratelimit_sidecar.storage.errors import StoreUnreadable
from ratelimit_sidecar.storage.keys import KeySchema, digest, span_stem, span_suffix

FIXED = RateLimit(10, Unit.MINUTE, cooldown_ms=5000)
SLIDING = RateLimit(10, Unit.MINUTE, spans=4, algorithm=AlgorithmName.SLIDING_WINDOW)
BUCKET = RateLimit(7, Unit.MINUTE, burst=20, algorithm=AlgorithmName.TOKEN_BUCKET)
LOG = RateLimit(10, Unit.MINUTE, algorithm=AlgorithmName.SLIDING_LOG)
W = 29_000_000
NOW = 1_700_000_000_000
KEYS = KeySchema("t:")
FIXED_, SLIDING_, BUCKET_ = (
    AlgorithmName.FIXED_WINDOW,
    AlgorithmName.SLIDING_WINDOW,
    AlgorithmName.TOKEN_BUCKET,
)


def codec(cluster: bool = False) -> SyncCodec:
    return SyncCodec(KEYS, cluster=cluster)


def mixed(count: int) -> list[Push]:
    """`count` keys, each pushed once per algorithm: fixed, sliding, bucket, log, fixed, ..."""
    limits = (FIXED, SLIDING, BUCKET, LOG)
    return [Push(("d", "u", str(i)), W, 1, limits[i % 4]) for i in range(count)]


def test_a_span_counter_name_is_the_stem_and_the_span_number() -> None:
    key: KeyId = ("gw", "api_key", "v")
    assert span_suffix(key, 174_000_003) == span_stem(key) + "174000003"
    assert span_suffix(key, 174_000_003).endswith(":gw:api_key:s174000003")


def test_a_sliding_entry_names_its_span_and_the_span_ttl() -> None:
    key: KeyId = ("gw", "ip", "1.2.3.4")
    pushes = [Push(key, W, 3, SLIDING, W * 4 + 2), Push(key, W, -1, SLIDING)]
    encoded = codec().encode(SyncBatch(NOW, pushes))
    numkeys, route, prefix, packed, *_channels = encoded.script_args[0]
    assert (numkeys, route, prefix) == (1, KEYS.counter(key, W), "t:")
    first, last_span = packed.split(";")
    assert first == f"{digest(key)}|:gw:ip:{W}|:gw:ip:s|{W * 4 + 2}|3|120000|90000|4|10|0|"
    assert last_span.split("|")[3:5] == [str(W * 4 + 3), "-1"]  # span -1: the window's last
    assert encoded.layout.scripts == (SLIDING_,)


def test_a_bucket_entry_carries_the_token_time_parts_and_capacity() -> None:
    key: KeyId = ("gw", "user", "u1")
    encoded = codec().encode(SyncBatch(NOW, [Push(key, W, 2, BUCKET)]))
    entry = encoded.script_args[0][3]
    assert entry == f"{digest(key)}|:gw:user:{W}|:gw:user:tb|2|120000|60000|7|20|0|"
    assert encoded.layout.scripts == (BUCKET_,)


def test_each_script_call_runs_one_algorithm_in_batch_order() -> None:
    pushes = mixed(2 * CHUNK_KEYS + 8)
    encoded = codec().encode(SyncBatch(NOW, pushes))
    layout = encoded.layout
    assert layout.scripts == (FIXED_, SLIDING_, BUCKET_)  # 502 pushes each: one call apiece
    for chunk, algorithm in zip(layout.chunks, layout.scripts, strict=True):
        assert {pushes[i].limit.algorithm for i in chunk} == {algorithm}
        assert chunk == tuple(sorted(chunk))
    assert layout.unsent == tuple(range(3, len(pushes), 4))
    sent = sorted(i for chunk in layout.chunks for i in chunk)
    assert sorted([*sent, *layout.unsent]) == list(range(len(pushes)))


def test_cluster_calls_hold_one_slot_and_one_algorithm() -> None:
    pushes = mixed(3000)
    encoded = codec(cluster=True).encode(SyncBatch(NOW, pushes))
    calls = zip(encoded.layout.chunks, encoded.layout.scripts, encoded.script_args, strict=True)
    for chunk, algorithm, args in calls:
        slots = {key_slot(KEYS.tag(pushes[i].key).encode()) for i in chunk}
        assert len(slots) == 1 and {pushes[i].limit.algorithm for i in chunk} == {algorithm}
        assert key_slot(args[1].encode()) in slots
    assert len(encoded.layout.unsent) == 750


def test_replies_are_read_per_algorithm_and_unsent_pushes_answer_an_error() -> None:
    layout = Layout(
        pushes=5,
        chunks=((0, 3), (1,), (2,)),
        total_reads=0,
        heartbeat=False,
        scripts=(SLIDING_, BUCKET_, FIXED_),
        unsent=(4,),
    )
    replies = [b"7,0,1 2 0 4;12,3000,0 0 0 12", b"18000,0", b"3,0"]
    result = codec().decode(layout, replies)
    assert result.pushes == (
        PushResult(7, 0, spans=(1, 2, 0, 4)),
        PushResult(18_000, 0),
        PushResult(3, 0),
        PushResult(12, 3000, spans=(0, 0, 0, 12)),
        PushResult(0, 0, error=UNSYNCABLE),
    )


def test_a_sliding_key_error_fails_alone() -> None:
    layout = Layout(1 + 1, ((0, 1),), 0, False, (SLIDING_,))
    result = codec().decode(layout, [b"E:WRONGTYPE x;5,0,0 5"])
    assert [(p.total, p.error, p.spans) for p in result.pushes] == [
        (0, "WRONGTYPE x", ()),
        (5, "", (0, 5)),
    ]


@pytest.mark.parametrize(
    ("algorithm", "reply"),
    [
        (SLIDING_, b"5,0"),  # no span totals
        (SLIDING_, b"5,0,1 x"),  # a span total that is not a number
        (SLIDING_, b"5,0,"),  # an empty list of span totals
        (SLIDING_, b"5,0,1 2,3"),  # one field too many
        (BUCKET_, b"5,0,1"),  # span totals where none belong
        (FIXED_, b"5,0,1"),
    ],
)
def test_a_malformed_answer_of_a_new_script_is_unreadable(
    algorithm: AlgorithmName, reply: bytes
) -> None:
    layout = Layout(1, ((0,),), 0, False, (algorithm,))
    with pytest.raises(StoreUnreadable) as raised:
        codec().decode(layout, [reply])
    assert raised.value.may_have_applied


def test_a_batch_of_sliding_logs_only_sends_no_script() -> None:
    pushes = [Push(("d", "u", str(i)), W, 1, LOG) for i in range(3)]
    encoded = codec().encode(SyncBatch(NOW, pushes))
    assert encoded.script_args == () and encoded.layout.unsent == (0, 1, 2)
    result = codec().decode(encoded.layout, [])
    assert {p.error for p in result.pushes} == {UNSYNCABLE}

"""What one sync sends to Redis and how its replies become a `SyncResult`. Pure: no I/O.

A sync is one non-transactional pipeline, in this order:

    EVALSHA <script>  per chunk of up to CHUNK_KEYS pushes of one algorithm (and one hash
                      slot on Cluster): sync.lua, sync_sliding.lua or sync_bucket.lua
    GET               per TotalRead
    EVAL <heartbeat>  when the batch carries it: the node's entry in the live node set, the
                      live count and the store's clock

Script arguments and answers are packed strings (redis-py encodes and parses in Python: one
value per call, not six per key, keeps a 100k-key sync well inside a span). A push no script
applies (a sliding log: the config refuses it) is answered with a per-key error, unsent.

Error replies are per command: a script call answered with an error (READONLY, OOM, MOVED...)
did not run, so each of its keys is "not applied"; a key the script could not count (wrong type)
is answered so alone; a failed GET or heartbeat leaves that value unknown (0).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.crc import key_slot  # a pure CRC16: the slot Redis Cluster routes a key to

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit
from ratelimit_sidecar.core.types import KeyId, Push, PushResult, SyncBatch, SyncResult
from ratelimit_sidecar.storage import scripts
from ratelimit_sidecar.storage import shared_rules as rules
from ratelimit_sidecar.storage.blocks import BLOCKS, NEAR
from ratelimit_sidecar.storage.errors import StoreUnreadable
from ratelimit_sidecar.storage.keys import (
    KeySchema,
    bucket_suffix,
    counter_suffix,
    digest,
    span_stem,
)
from ratelimit_sidecar.storage.scripts import KEY_ERROR, MAX_REASON

CHUNK_KEYS = 1000  # keys per script call: big enough to amortise, small enough not to stall Redis
# Sent with its text (EVAL): a few hundred bytes a span, and no NOSCRIPT path of its own.
HEARTBEAT = scripts.load("heartbeat.lua")
# The sync script of each algorithm synced per span; a push of any other is never sent.
SCRIPT_FILES = {
    AlgorithmName.FIXED_WINDOW: "sync.lua",
    AlgorithmName.SLIDING_WINDOW: "sync_sliding.lua",
    AlgorithmName.TOKEN_BUCKET: "sync_bucket.lua",
}
UNSYNCABLE = "sliding_log is never synced per span"
Command = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Layout:
    """The shape of one sync's pipeline: what each reply answers."""

    pushes: int  # pushes in the batch
    chunks: tuple[tuple[int, ...], ...]  # per script call: the indexes of its pushes
    total_reads: int
    heartbeat: bool
    scripts: tuple[AlgorithmName, ...]  # per script call: whose sync script it runs
    unsent: tuple[int, ...] = ()  # indexes of pushes no script applies (answered an error)

    @property
    def script_calls(self) -> int:
        return len(self.chunks)

    @property
    def replies(self) -> int:
        return self.script_calls + self.total_reads + self.heartbeat


@dataclass(frozen=True, slots=True)
class Encoded:
    """Script calls first, then the other commands."""

    layout: Layout
    script_args: tuple[Command, ...]  # numkeys, KEYS and ARGV of the sync script, per call
    commands: tuple[Command, ...]  # the reads and the heartbeat

    def routing_keys(self) -> set[str]:
        keys = {str(args[1]) for args in self.script_args}
        for command in self.commands:
            if command[0] == "EVAL":
                keys.add(str(command[3]))
            elif len(command) > 1:
                keys.add(str(command[1]))
        return keys


class SyncCodec:
    def __init__(
        self, keys: KeySchema, *, cluster: bool, node_id: str = "", node_ttl_ms: int = 0
    ) -> None:
        self.keys = keys
        self.blocks_channel = keys.channel(BLOCKS)  # where the scripts announce a new block
        self.near_channel = keys.channel(NEAR)  # ... and a window that came near its limit
        self.cluster = cluster
        self.node_id = node_id
        self.node_ttl_ms = node_ttl_ms

    @property
    def heartbeat_on(self) -> bool:
        return bool(self.node_id and self.node_ttl_ms)

    def encode(self, batch: SyncBatch) -> Encoded:
        pushes = batch.pushes
        groups, unsent = self.groups(pushes)
        calls = [(a, c) for a, group in groups.items() for c in self.chunks(pushes, group)]
        layout = Layout(
            pushes=len(pushes),
            chunks=tuple(chunk for _, chunk in calls),
            total_reads=len(batch.total_reads),
            heartbeat=self.heartbeat_on and batch.heartbeat,
            scripts=tuple(algorithm for algorithm, _ in calls),
            unsent=tuple(unsent),
        )
        args = tuple(self.script_args(pushes, chunk) for chunk in layout.chunks)
        return Encoded(layout, args, tuple(self.commands(batch)))

    def decode(self, layout: Layout, replies: Sequence[Any]) -> SyncResult:
        """StoreUnreadable if the replies do not fit `layout`: what the scripts did is unknown."""
        if len(replies) != layout.replies:
            raise StoreUnreadable(f"{len(replies)} replies for {layout.replies} commands")
        calls, totals_end = layout.script_calls, layout.script_calls + layout.total_reads
        try:
            pushes = push_results(layout, replies[:calls])
        except (TypeError, ValueError) as exc:
            raise StoreUnreadable(f"unreadable sync reply: {exc}") from exc
        live, store_time, failed = 0, 0, ""
        if layout.heartbeat:
            live, store_time, failed = heartbeat_answer(replies[totals_end])
        return SyncResult(
            pushes=pushes,
            totals=tuple(number(r) for r in replies[calls:totals_end]),
            live_nodes=live,
            store_time_ms=store_time,
            heartbeat_error=failed,
        )

    @staticmethod
    def groups(pushes: Sequence[Push]) -> tuple[dict[AlgorithmName, list[int]], list[int]]:
        """Push indexes per sync script, in batch order, and those no script applies."""
        groups: dict[AlgorithmName, list[int]] = {}
        unsent: list[int] = []
        for index, push in enumerate(pushes):
            algorithm = push.limit.algorithm
            group = groups.setdefault(algorithm, []) if algorithm in SCRIPT_FILES else unsent
            group.append(index)
        return groups, unsent

    def chunks(self, pushes: Sequence[Push], group: list[int]) -> tuple[tuple[int, ...], ...]:
        """Cut into calls; on Cluster a call may only touch one slot."""
        slots = by_slot((i, pushes[i].key) for i in group) if self.cluster else [group]
        return tuple(
            tuple(slot[i : i + CHUNK_KEYS])
            for slot in slots
            for i in range(0, len(slot), CHUNK_KEYS)
        )

    def script_args(self, pushes: Sequence[Push], chunk: Sequence[int]) -> Command:
        first = pushes[chunk[0]]
        entry = SCRIPT_ENTRIES[first.limit.algorithm]
        entries = [entry(pushes[index]) for index in chunk]
        route = self.keys.counter(first.key, first.window)
        channels = (self.blocks_channel, self.near_channel)
        return (1, route, self.keys.prefix, ";".join(entries), *channels)

    def commands(self, batch: SyncBatch) -> list[Command]:
        keys = self.keys
        commands: list[Command] = [
            ("GET", keys.counter(r.key, r.window)) for r in batch.total_reads
        ]
        if self.heartbeat_on and batch.heartbeat:
            beat = (self.node_id, batch.now_ms, self.node_ttl_ms)
            commands.append(HEARTBEAT.eval(1, keys.nodes(), *beat))
        return commands


def by_slot(keys: Iterable[tuple[int, KeyId]]) -> list[list[int]]:
    """The indexes grouped by their key's Redis Cluster slot (the digest is the hash tag)."""
    slots: dict[int, list[int]] = {}
    for index, key in keys:
        slots.setdefault(key_slot(digest(key).encode()), []).append(index)
    return list(slots.values())


# One push packed as its algorithm's sync script reads it (see each script's header).


def fixed_entry(push: Push) -> str:
    limit = push.limit
    ttl = rules.window_ttl_ms(limit)
    announce = 2 if push.edge else int(push.announce)  # sync.lua's announce field
    fields = push.hits, ttl, limit.requests_per_unit, limit.cooldown, announce
    return _entry(push, *fields)


def sliding_entry(push: Push) -> str:
    limit, span = push.limit, rules.pushed_span(push)
    ttls = rules.window_ttl_ms(limit), rules.span_ttl_ms(limit)
    stem = span_stem(push.key)
    return _entry(
        push, stem, span, push.hits, *ttls, limit.spans, limit.requests_per_unit, limit.cooldown
    )


def bucket_entry(push: Push) -> str:
    limit, ttl = push.limit, rules.window_ttl_ms(push.limit)
    state, rpu = bucket_suffix(push.key), limit.requests_per_unit
    return _entry(push, state, push.hits, ttl, limit.window_ms, rpu, limit.capacity, limit.cooldown)


def _entry(push: Push, *fields: object) -> str:
    """digest|window counter suffix|the script's own fields|penalty spec."""
    spec = penalty_spec(push.limit, push.wanted_level, push.blocking_level)
    head = (digest(push.key), counter_suffix(push.key, push.window))
    return "|".join(map(str, (*head, *fields, spec)))


def penalty_spec(limit: RateLimit, wanted: int, blocking: int = -1) -> str:
    """ "factor/max_ms/forgive_after_ms/wanted/blocking" (penalty.lua), "" without a penalty."""
    penalty = limit.penalty
    if penalty is None:
        return ""
    return f"{penalty.factor!r}/{penalty.max_ms}/{penalty.forgive_after_ms}/{wanted}/{blocking}"


SCRIPT_ENTRIES: dict[AlgorithmName, Callable[[Push], str]] = {
    AlgorithmName.FIXED_WINDOW: fixed_entry,
    AlgorithmName.SLIDING_WINDOW: sliding_entry,
    AlgorithmName.TOKEN_BUCKET: bucket_entry,
}


def push_results(layout: Layout, replies: Sequence[Any]) -> tuple[PushResult, ...]:
    """Each call's answers in batch order; an error reply answers each of its keys."""
    results: list[PushResult | None] = [None] * layout.pushes
    for index in layout.unsent:
        results[index] = PushResult(0, 0, error=UNSYNCABLE)
    for chunk, algorithm, reply in zip(layout.chunks, layout.scripts, replies, strict=True):
        if isinstance(reply, Exception):
            refused = PushResult(0, 0, error=short(str(reply)))
            for index in chunk:
                results[index] = refused
            continue
        with_spans = algorithm is AlgorithmName.SLIDING_WINDOW
        for index, answer in zip(chunk, script_answers(reply, len(chunk)), strict=True):
            results[index] = push_result(answer, with_spans)
    if any(r is None for r in results):
        raise ValueError("sync script calls do not cover every push")
    return tuple(r for r in results if r is not None)


def script_answers(reply: Any, keys: int) -> list[str]:
    if not isinstance(reply, bytes | str):
        raise TypeError(f"sync script answered {type(reply).__name__}, not text")
    text = reply.decode() if isinstance(reply, bytes) else reply
    answers = text.split(";") if text else []
    if len(answers) != keys:
        raise ValueError(f"sync script answered {len(answers)} of {keys} keys")
    return answers


def push_result(answer: str, with_spans: bool = False) -> PushResult:
    """ "total,left" ("total,left,t1 t2 ... tN" for a sliding window: span totals, oldest
    first), then "|level|block_level" if penalised; or "E:<reason>": nothing applied."""
    if answer.startswith(KEY_ERROR):
        return PushResult(0, 0, error=answer[len(KEY_ERROR) :] or "error")
    level = block_level = -1
    if "|" in answer:
        answer, levels, blocked_at = answer.split("|")
        level, block_level = int(levels), int(blocked_at)
    spans: tuple[int, ...] = ()
    if with_spans:
        total, left, span_totals = answer.split(",")
        spans = tuple(int(t) for t in span_totals.split(" "))
    else:
        total, left = answer.split(",")
    # A flag without a TTL (-1, never written by the script) must not block forever.
    return PushResult(int(total), max(0, int(left)), "", spans, level, max(0, block_level))


def number(reply: Any) -> int:
    """0 (unknown) for an error reply, a missing key or anything else."""
    try:
        return int(reply) if isinstance(reply, int | bytes | str) else 0
    except ValueError:
        return 0


def heartbeat_answer(reply: Any) -> tuple[int, int, str]:
    """(live nodes, the store's clock in ms, "") or (0, 0, why it failed)."""
    try:
        live, seconds, micros = reply
        return int(live), int(seconds) * 1000 + int(micros) // 1000, ""
    except (TypeError, ValueError):
        return 0, 0, short(str(reply))


def short(message: str) -> str:
    return " ".join(message.split())[:MAX_REASON] or "error"

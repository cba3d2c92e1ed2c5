"""Helpers for the trailing-window rules' tests: rules, traces and a store of span totals."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterator

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Rule, Unit
from ratelimit_sidecar.core import FleetLimiter, KeyId, PushResult, SyncBatch, SyncResult

T0 = 1_700_000_040_000  # a window boundary for every unit up to a minute
WINDOW = AlgorithmName.SLIDING_WINDOW
LOG = AlgorithmName.SLIDING_LOG


def trailing_rule(
    algorithm: AlgorithmName,
    rpu: int = 10,
    *,
    spans: int = 4,
    cooldown_ms: int = 0,
    shadow: bool = False,
    unit: Unit = Unit.SECOND,
    key: str = "k",
) -> Rule:
    limit = RateLimit(rpu, unit, spans=spans, cooldown_ms=cooldown_ms, algorithm=algorithm)
    return Rule("d", ((key, ""),), limit, shadow_mode=shadow)


def random_trace(seed: int, length: int, mean_gap_ms: int) -> Iterator[tuple[int, int]]:
    """(time, hits) of requests: mostly small gaps, some same-millisecond, a few silences of
    up to a few windows (of a second)."""
    rnd = random.Random(seed)
    now = T0 + rnd.randrange(1000)
    for _ in range(length):
        now += rnd.choice([0, 0, 1, 2, mean_gap_ms // 2, mean_gap_ms, 3 * mean_gap_ms])
        if rnd.random() < 0.01:
            now += rnd.randrange(500, 3000)
        yield now, rnd.choice([1, 1, 1, 1, 2, 3])


def boundary_bursts(rpu: int, window_ms: int, windows: int) -> Iterator[tuple[int, int]]:
    """MAX one hit at a time in the last ms of each window, then MAX in its next first ms."""
    for w in range(1, windows + 1):
        start = T0 + w * window_ms
        yield from [(start - 1, 1)] * rpu
        yield from [(start, 1)] * rpu


def span_end_bursts(rpu: int, window_ms: int, spans: int, count: int) -> Iterator[tuple[int, int]]:
    """MAX in the last ms of a span, then a steady stream: the weighting's worst case (the
    oldest span's hits are assumed spread over it, and all sit at its end)."""
    length = window_ms // spans
    for n in range(count):
        last_ms = T0 + n * 2 * window_ms + length - 1
        yield from [(last_ms, 1)] * rpu
        # through the span a window later, while those hits are still in the trailing window
        yield from ((last_ms + window_ms - length + 1 + step, 1) for step in range(length - 1))


def worst_trailing_count(times: list[int], window_ms: int) -> int:
    """The most admitted hits in any trailing window (t - W, t] (one entry per hit)."""
    times = sorted(times)
    worst, first = 0, 0
    for last, t in enumerate(times):
        while times[first] <= t - window_ms:
            first += 1
        worst = max(worst, last - first + 1)
    return worst


class SpanStore:
    """The shared store's contract for sliding windows (see the notes on core/storage): a
    push adds its count to its span's and its window's counters and answers the N span totals
    ending with its span."""

    def __init__(self) -> None:
        self.spans: defaultdict[tuple[KeyId, int], int] = defaultdict(int)
        self.windows: defaultdict[tuple[KeyId, int], int] = defaultdict(int)

    def execute(self, batch: SyncBatch, live_nodes: int = 0) -> SyncResult:
        answers = []
        for push in batch.pushes:
            n = push.limit.spans
            span = push.span if push.span >= 0 else (push.window + 1) * n - 1
            self.spans[push.key, span] += push.hits
            self.windows[push.key, push.window] += push.hits
            totals = tuple(self.spans[push.key, j] for j in range(span - n + 1, span + 1))
            answers.append(PushResult(sum(totals), 0, spans=totals))
        reads = tuple(self.windows[read.key, read.window] for read in batch.total_reads)
        return SyncResult(tuple(answers), reads, live_nodes=live_nodes)


class PromptStore:
    """A store every span end of one fleet node syncs with as it happens."""

    def __init__(self, limiter: FleetLimiter) -> None:
        self.limiter, self.store, self.synced_ms = limiter, SpanStore(), T0

    def sync_until(self, now: int) -> None:
        limiter = self.limiter
        while (end := limiter.next_span_end(self.synced_ms)) is not None and end <= now:
            batch = limiter.end_span(end)
            limiter.apply_sync(end, batch, self.store.execute(batch, live_nodes=1))
            self.synced_ms = end

"""A refused sliding-window request's wait walks the spans once (review finding 2): the spans
still wholly inside at each step are a running suffix sum, not a new sum per step, and the
answer is the one the per-step sum gave."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Unit
from ratelimit_sidecar.core import trailing_wait
from ratelimit_sidecar.core.spans import span_bounds, span_number

T0 = 1_700_000_040_000


def quadratic_wait_ms(limit: RateLimit, counts: list[Any], extra: float, now_ms: int) -> int:
    """The walk as it was before the fix (a sum per step): the reference for identity."""
    max_hits = limit.requests_per_unit
    if extra > max_hits:
        return int(limit.window_ms)
    span = span_number(now_ms, limit)
    for step in range(len(counts) + 1):
        start, end = span_bounds(span + step, limit)
        at = max(now_ms, start)
        oldest = counts[step] if step < len(counts) else 0
        room = (max_hits - sum(counts[step + 1 :]) - extra) * (end - start)
        if room >= 0 and oldest * (end - 1 - at) <= room:
            return at - now_ms
        if room >= 0:
            return int(end - 1 - int(room // oldest) - now_ms)
    return int(limit.window_ms)


def sliding(rpu: int, spans: int, unit: Unit) -> RateLimit:
    return RateLimit(rpu, unit, spans=spans, algorithm=AlgorithmName.SLIDING_WINDOW)


@settings(max_examples=300, deadline=None)
@given(
    spans=st.integers(2, 40),
    rpu=st.integers(1, 200),
    hits=st.integers(1, 30),
    offset_ms=st.integers(0, 600_000),
    ahead=st.integers(0, 3),
    quarters=st.booleans(),
    data=st.data(),
)
def test_wait_is_the_per_step_sums_wait(
    spans: int,
    rpu: int,
    hits: int,
    offset_ms: int,
    ahead: int,
    quarters: bool,
    data: st.DataObject,
) -> None:
    limit = sliding(rpu, spans, Unit.MINUTE)
    now, extra = T0 + offset_ms, hits * (1.5 if quarters else 1)
    # integers, or quarters (a fleet's estimate x nodes): sums exact either way; the counts
    # run from the oldest span in the window to the newest counted (`ahead` of now's)
    step = 0.25 if quarters else 1
    values = st.integers(0, rpu).map(lambda n: n * step)
    wanted = st.lists(values, min_size=spans + 1 + ahead, max_size=spans + 1 + ahead)
    counts = data.draw(wanted)
    expected = quadratic_wait_ms(limit, counts, extra, now)
    assert trailing_wait.walk_wait_ms(limit, counts, extra, now) == expected


class Counted(int):
    """An int whose additions are counted: the walk's work, independent of the machine."""

    additions = 0

    def __add__(self, other: object) -> Any:
        Counted.additions += 1
        return int(self) + other  # type: ignore[operator]

    def __radd__(self, other: object) -> Any:
        Counted.additions += 1
        return other + int(self)  # type: ignore[operator]


def test_a_long_windows_refusal_walks_its_spans_once() -> None:
    spans = 3600  # an hour in seconds: the most spans a rule may have
    limit = sliding(spans * 10, spans, Unit.HOUR)
    now = T0 + 1_234
    # the newest span holds the whole limit: the request fits only once it has left
    counts: list[Any] = [Counted(0) for _ in range(spans)] + [Counted(limit.requests_per_unit)]
    Counted.additions = 0
    wait = trailing_wait.walk_wait_ms(limit, counts, 1, now)
    work = Counted.additions
    assert wait > limit.window_ms - 2_000  # the walk went to the end
    if trailing_wait.__file__.endswith(".py"):  # compiled, the sums add C doubles, uncounted
        assert 0 < work <= 2 * (spans + 1)  # a sum per step: about spans² / 2 = 6.5 million

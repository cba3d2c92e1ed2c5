from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ratelimit_sidecar.core.spans import span_end, span_index, window_end, window_of


def test_spans_tile_a_window_that_n_does_not_divide() -> None:
    ends = []
    t = 0
    while t < 1000:
        t = span_end(t, 1000, 6)
        ends.append(t)
    assert ends == [167, 334, 500, 667, 834, 1000]


@given(st.integers(0, 10**13), st.integers(1, 10**7), st.integers(2, 60))
def test_every_instant_is_in_exactly_one_span_of_its_window(now: int, window: int, n: int) -> None:
    end = span_end(now, window, n)
    assert now < end <= window_end(now, window)
    assert 0 <= span_index(now, window, n) < n
    assert window_of(end - 1, window) == window_of(now, window)
    assert span_index(end - 1, window, n) == span_index(now, window, n)

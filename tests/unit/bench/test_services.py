"""bench/services.py's count-fast: the empty answer, after counting each distinct body."""

from __future__ import annotations

from bench.services import Counting


def test_count_fast_counts_each_body_and_answers_the_prebuilt_bytes() -> None:
    answer = Counting(b"ok")
    assert [answer(body) for body in (b"a", b"b", b"a")] == [b"ok"] * 3
    assert answer.counts == {b"a": 2, b"b": 1}

"""The relay's command counter: complete commands only, however the stream is cut."""

from __future__ import annotations

from harness.command_counter import RespCounter

PIPELINE = (
    b"*2\r\n$4\r\nINCR\r\n$1\r\nk\r\n"
    b"*3\r\n$6\r\nEXPIRE\r\n$1\r\nk\r\n$2\r\n60\r\n"
    b"*3\r\n$3\r\nSET\r\n$1\r\nv\r\n$4\r\na\r\nb\r\n"  # a value holding CRLF
    b"PING\r\n"
)


def test_counts_every_command_of_a_pipeline() -> None:
    counter = RespCounter()
    counter.feed(PIPELINE)
    assert counter.commands == 4


def test_counts_a_command_only_once_it_is_complete() -> None:
    counter = RespCounter()
    for index in range(len(PIPELINE)):
        counter.feed(PIPELINE[index : index + 1])
        assert counter.commands <= 4
    assert counter.commands == 4


def test_a_partial_command_is_not_counted() -> None:
    counter = RespCounter()
    counter.feed(PIPELINE[:30])
    assert counter.commands == 1

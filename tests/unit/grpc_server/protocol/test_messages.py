"""gRPC message framing (messages.py): messages cut from DATA, reserved from the budget while
they span frames, refused past their size or the budget's room."""

from __future__ import annotations

import pytest

from ratelimit_sidecar.grpc_server.protocol.messages import (
    MessageBudget,
    MessageFault,
    MessageReader,
    whole_message,
)
from tests.unit.grpc_server.protocol.peer import grpc_message


def test_whole_message() -> None:
    assert whole_message(grpc_message(b"abc"))
    assert whole_message(grpc_message(b""))
    assert not whole_message(grpc_message(b"abc")[:-1])
    assert not whole_message(grpc_message(b"abc") + b"\0")
    assert not whole_message(b"\1" + grpc_message(b"abc")[1:])


def test_messages_are_cut_whatever_the_frames() -> None:
    budget = MessageBudget(1000)
    reader = MessageReader(budget, 100)
    stream = grpc_message(b"one") + grpc_message(b"") + grpc_message(b"three")
    cuts = [cut for i in range(0, len(stream), 3) for cut in reader.feed(stream[i : i + 3])]
    assert [cut.message for cut in cuts] == [b"one", b"", b"three"]
    assert reader.missing() == 0
    assert budget.used == sum(cut.reserved for cut in cuts) == 8 + 10  # the stream releases it


def test_a_message_spanning_frames_is_reserved_whole_until_cut() -> None:
    budget = MessageBudget(1000)
    reader = MessageReader(budget, 100)
    message = grpc_message(b"x" * 50)
    assert reader.feed(message[:10]) == []
    assert budget.used == 55 and reader.missing() == 45
    (cut,) = reader.feed(message[10:])
    assert (cut.message, cut.reserved, cut.earlier) == (b"x" * 50, 55, 10)
    budget.release(cut.reserved)
    assert budget.used == 0


def test_a_message_over_the_largest_is_refused_at_its_prefix() -> None:
    reader = MessageReader(MessageBudget(1000), 100)
    with pytest.raises(MessageFault) as fault:
        reader.feed(b"\0" + (101).to_bytes(4, "big"))
    assert (fault.value.status, fault.value.bound) == (8, "size")


def test_a_message_the_budget_has_no_room_for_is_refused() -> None:
    budget = MessageBudget(60)
    MessageReader(budget, 100).feed(grpc_message(b"x" * 50)[:20])
    with pytest.raises(MessageFault) as fault:
        MessageReader(budget, 100).feed(grpc_message(b"y" * 10)[:8])
    assert (fault.value.status, fault.value.bound) == (8, "budget")
    assert budget.refusals == 1 and budget.used == 55


def test_a_compressed_flag_is_internal() -> None:
    with pytest.raises(MessageFault) as fault:
        MessageReader(MessageBudget(1000), 100).feed(b"\1\0\0\0\1x")
    assert fault.value.status == 13


def test_closing_a_reader_releases_its_reservation() -> None:
    budget = MessageBudget(1000)
    reader = MessageReader(budget, 100)
    reader.feed(grpc_message(b"x" * 50)[:20])
    reader.close()
    assert budget.used == 0

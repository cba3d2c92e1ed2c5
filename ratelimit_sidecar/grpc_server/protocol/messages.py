"""gRPC messages in a stream's DATA (PROTOCOL-HTTP2.md in grpc/grpc): each is a compressed
flag octet, a 4-octet big-endian length, then that many octets. Messages need not align with
DATA frames: one frame may hold several, and one message may span many frames.

A message that arrives whole in one frame is sliced out of it and handed on at once. One that
spans frames is buffered until complete, and those buffered octets are what MessageBudget
counts across the whole process: the first DATA that shows a message's length reserves all of
it, or refuses the message (RESOURCE_EXHAUSTED) when the budget has no room. A message whose
length is over `max_bytes` is refused as soon as its length prefix arrives (RESOURCE_EXHAUSTED);
a set compressed flag is an error, as the server accepts no `grpc-encoding` but identity
(INTERNAL, as gRPC servers answer it).
"""

from __future__ import annotations

from typing import Final

DEFAULT_BUDGET_BYTES: Final = 64 * 1024 * 1024  # sixteen messages of gRPC's usual 4 MiB limit
GRPC_INTERNAL: Final = 13
GRPC_RESOURCE_EXHAUSTED: Final = 8
PREFIX: Final = 5  # flag octet and length


class MessageFault(Exception):
    """A request's messages break a rule: the call ends with gRPC status `status`."""

    def __init__(self, status: int, message: str, bound: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.bound = bound  # "size" or "budget" when a bound refused the message


class MessageBudget:
    """Octets of request messages buffered unfinished, across every connection of a process.
    One object, passed to every connection's core; `refusals` counts the messages it refused."""

    __slots__ = ("capacity", "refusals", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.refusals = 0

    def reserve(self, size: int) -> None:
        if self.used + size > self.capacity:
            self.refusals += 1
            text = "the server's request buffers are full"
            raise MessageFault(GRPC_RESOURCE_EXHAUSTED, text, "budget")
        self.used += size

    def release(self, size: int) -> None:
        self.used -= size

    def has_room(self) -> bool:
        return self.used < self.capacity


def whole_message(data: bytes) -> bool:
    """`data` is exactly one uncompressed message: the common unary request's one DATA frame."""
    return (
        len(data) >= PREFIX and data[0] == 0 and int.from_bytes(data[1:5], "big") == len(data) - 5
    )


def check_prefix(data: bytes | bytearray, max_bytes: int) -> int:
    """The size, prefix included, of the message whose prefix starts `data`."""
    if data[0]:
        raise MessageFault(GRPC_INTERNAL, "a compressed message, and no grpc-encoding to read it")
    size = int.from_bytes(data[1:5], "big")
    if size > max_bytes:
        text = f"request message of {size} octets is over the limit of {max_bytes}"
        raise MessageFault(GRPC_RESOURCE_EXHAUSTED, text, "size")
    return PREFIX + size


class MessageReader:
    """One stream's request octets cut into messages, once they stopped arriving whole.

    A message that spans DATA frames is reserved from the budget when its length is known: the
    connection may then credit its octets back as they arrive. `feed` returns, per message it
    completes, the message, the octets reserved for it (0 if none) and how many of its octets
    arrived in earlier payloads. `advance` is stream window granted ahead for the current
    message (stream.py); it goes with the message when complete."""

    __slots__ = ("advance", "budget", "buffer", "max_bytes", "reserved", "size")

    def __init__(self, budget: MessageBudget, max_bytes: int) -> None:
        self.budget = budget
        self.max_bytes = max_bytes
        self.buffer = bytearray()  # the octets of the current message, and of those after it
        self.size = 0  # the current message's size with its prefix, 0 until its prefix is read
        self.reserved = 0  # octets reserved for the current message
        self.advance = 0

    def feed(self, data: bytes) -> list[Cut]:
        carried = len(self.buffer)
        self.buffer += data
        cuts: list[Cut] = []
        try:
            self._cut(cuts, carried)
        except MessageFault:
            release_all(self.budget, cuts)  # the call ends: nothing it cut is handed on
            raise
        return cuts

    def _cut(self, cuts: list[Cut], carried: int) -> None:
        while len(self.buffer) >= PREFIX:
            if not self.size:
                self.size = check_prefix(self.buffer, self.max_bytes)
            if len(self.buffer) < self.size:
                if not self.reserved:
                    self.budget.reserve(self.size)
                    self.reserved = self.size
                break
            message = bytes(self.buffer[PREFIX : self.size])
            cuts.append(Cut(message, self.reserved, carried, self.advance))
            del self.buffer[: self.size]
            self.reserved = self.size = self.advance = carried = 0

    def missing(self) -> int:
        """Octets the current message still needs (0 when its length is not known yet)."""
        return self.size - len(self.buffer) if self.size else 0

    def close(self) -> None:
        """The stream ended: its reservation goes back to the budget."""
        self.budget.release(self.reserved)
        self.reserved = 0
        self.buffer.clear()


def release_all(budget: MessageBudget, cuts: list[Cut]) -> None:
    for cut in cuts:
        budget.release(cut.reserved)
        cut.reserved = 0


class Cut:
    """A message `feed` completed: `reserved` octets of the budget it holds, octets of it that
    arrived `earlier`, stream window granted in `advance` for it; `held`, the connection credit
    that waits for the message to be consumed (set when handed out)."""

    __slots__ = ("advance", "earlier", "held", "message", "reserved")

    def __init__(self, message: bytes, reserved: int, earlier: int, advance: int) -> None:
        self.message = message
        self.reserved = reserved
        self.earlier = earlier
        self.advance = advance
        self.held = 0

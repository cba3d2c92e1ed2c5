"""When a connection's streams are due: a heap of (due time, stream id), filled lazily.

A stream is armed only if it is still open when the adapter next asks for the next timer, so a
call answered in the read that opened it (the common unary call) never touches the heap. An
entry whose stream is gone is skipped when it comes up; a stream whose due time moved later
(a streaming call's next message) is pushed again with its new time.
"""

from __future__ import annotations

import heapq

from ratelimit_sidecar.grpc_server.protocol.stream import NEVER, Stream


class StreamTimers:
    __slots__ = ("_fresh", "_heap")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._fresh: list[Stream] = []  # opened since the heap was last armed

    def opened(self, stream: Stream) -> None:
        self._fresh.append(stream)

    def next_due(self, streams: dict[int, Stream]) -> float:
        self._arm(streams)
        return self._heap[0][0] if self._heap else NEVER

    def due(self, streams: dict[int, Stream], now: float) -> list[Stream]:
        """The streams whose time has come."""
        self._arm(streams)
        found = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            stream = streams.get(heapq.heappop(heap)[1])
            if stream is None:
                continue
            due = stream.due()
            if due <= now:
                found.append(stream)
            elif due != NEVER:
                heapq.heappush(heap, (due, stream.stream_id))
        return found

    def _arm(self, streams: dict[int, Stream]) -> None:
        for stream in self._fresh:
            due = stream.due()
            if due != NEVER and streams.get(stream.stream_id) is stream:
                heapq.heappush(self._heap, (due, stream.stream_id))
        self._fresh.clear()

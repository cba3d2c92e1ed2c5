"""A loopback TCP relay in front of Redis that counts the commands clients send through it.

Redis's own counters (INFO commandstats, total_commands_processed, CLIENT LIST tot-cmds, the
slow log) also count every command a Lua script runs, so they cannot tell what a client sent
from what its scripts did; this relay can. It parses only the client's side of the stream
(RESP arrays, or inline commands) and passes every byte on unchanged in both directions.

    with CommandCounter(redis_port) as relay:   # relay.url: redis://127.0.0.1:<port>/0
        ...
        relay.commands, relay.bytes_sent
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

from harness.net import free_port

CHUNK = 65536


class RespCounter:
    """Counts complete commands in a client's byte stream fed in arbitrary pieces."""

    def __init__(self) -> None:
        self.commands = 0
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data
        start = 0
        while (end := self._command_end(start)) is not None:
            self.commands += 1
            start = end
        del self._buffer[:start]

    def _command_end(self, start: int) -> int | None:
        """Where the command starting at `start` ends, None while it is incomplete."""
        buffer = self._buffer
        line_end = buffer.find(b"\r\n", start)
        if line_end < 0:
            return None
        if buffer[start : start + 1] != b"*":  # an inline command: one line
            return line_end + 2
        position = line_end + 2
        for _ in range(int(buffer[start + 1 : line_end])):
            header_end = buffer.find(b"\r\n", position)
            if header_end < 0:
                return None
            length = int(buffer[position + 1 : header_end])  # "$<length>"
            position = header_end + 2 + length + 2
            if position > len(buffer):
                return None
        return position


class CommandCounter:
    """Relays 127.0.0.1:<port> to the Redis at `target_port`, counting what clients send."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._counters: list[RespCounter] = []
        self.bytes_sent = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def commands(self) -> int:
        with self._lock:
            return sum(counter.commands for counter in self._counters)

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(("127.0.0.1", self.target_port))
                counter = RespCounter()
                with self._lock:
                    self._counters.append(counter)
                    self._sockets += [client, server]
                threading.Thread(
                    target=self._relay, args=(client, server, counter), daemon=True
                ).start()
                threading.Thread(
                    target=self._relay, args=(server, client, None), daemon=True
                ).start()

    def _relay(
        self, source: socket.socket, sink: socket.socket, counter: RespCounter | None
    ) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(CHUNK):
                if counter is not None:
                    with self._lock:
                        counter.feed(data)
                        self.bytes_sent += len(data)
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> CommandCounter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

"""A closed-loop gRPC load generator in one process (HTTP/2 by hand on stdlib sockets) that keeps
the fast transport's core busy while cycling through 100,000 distinct bodies. Config (JSON):
address, path, frames, offset, connections, streams, settleS, durationS, latencyFile.

Connection c sends body offset + c + j * connections of `frames` (back-to-back gRPC frames) on
stream 2j + 1, encoded CHUNK requests at a time: k requests leave as one slice in one `send`.
Answers are read by frame headers: an OK one has DATA starting with overall_code OK and ends its
stream with trailers seen before to carry grpc-status 0 (new ones are decoded). Prints one JSON
line; writes the latencies (float64 ms) of the answers inside the window to latencyFile.
"""

from __future__ import annotations

import json
import selectors
import socket
import struct
import sys
import time
from array import array
from bisect import bisect_right
from itertools import accumulate
from pathlib import Path
from typing import Any

import hpack

from ratelimit_sidecar.server.transport import frames as f

WINDOW = f.MAX_WINDOW  # ours, per stream and for the connection: the server never waits on us
SETTINGS = {f.SETTINGS_HEADER_TABLE_SIZE: 0, f.SETTINGS_INITIAL_WINDOW_SIZE: WINDOW}
HELLO = f.PREFACE + f.settings(SETTINGS) + f.window_update(0, WINDOW - f.DEFAULT_WINDOW)
CHUNK = 512  # requests encoded at a time per connection
DRAIN_S = 2.0  # after the window, answers still due are awaited this long at most
MAX_REQUESTS = 50_000_000  # per run, over all connections
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
DATA, HEADERS, END_STREAM = f.DATA, f.HEADERS, f.END_STREAM  # globals: read per frame
unpack_header = f.FRAME_HEADER.unpack_from


def load_frames(path: str) -> list[bytes]:
    data, found, at = Path(path).read_bytes(), [], 0
    while at < len(data):
        found.append(data[at : (at := at + 5 + int.from_bytes(data[at + 1 : at + 5]))])
    if not found or max(map(len, found)) > f.DEFAULT_FRAME_SIZE:
        raise ValueError(f"{path}: no frames, or one over {f.DEFAULT_FRAME_SIZE} bytes")
    return found


def header_block(path: str, authority: str) -> bytes:
    """Static-table indexes and never-indexed literals: no dynamic table on either side."""
    never = hpack.NeverIndexedHeaderTuple
    return hpack.Encoder().encode([
        (":method", "POST"), (":scheme", "http"), never(":path", path),
        never(":authority", authority), never("content-type", "application/grpc"),
        never("te", "trailers"),
    ])  # fmt: skip


class Requests:
    """A connection's requests, CHUNK in `chunk` at a time: its i-th at byte `ends[i]`, after
    `data[i]` DATA bytes; `pos` of them sent, `base` before it."""

    def __init__(self, frames: list[bytes], block: bytes, first: int, stride: int) -> None:
        self.frames, self.block, self.first, self.stride = frames, block, first, stride
        self.base, self.pos, self.chunk, self.ends, self.data = 0, 0, b"", [0], [0]
        # the frame headers but their stream ids: HEADERS's before, DATA's after the block
        self.heads = f.frame(f.HEADERS, f.END_HEADERS, 0, block)[:5]
        self.middles = {
            n: block + f.frame(f.DATA, f.END_STREAM, 0, bytes(n))[:5] for n in {*map(len, frames)}
        }

    @property
    def sent(self) -> int:
        return self.base + self.pos

    def encode(self) -> None:
        """The next CHUNK: per request its HEADERS frame, then its body in one DATA frame."""
        self.base, self.pos, frames, size = self.sent, 0, self.frames, len(self.block) + 18
        js = range(self.base, self.base + CHUNK)
        picks = [(self.first + j * self.stride) % len(frames) for j in js]
        parts: list[bytes] = []
        for j, pick in zip(js, picks, strict=True):
            sid = (2 * j + 1).to_bytes(4)
            body = frames[pick]
            parts += (self.heads, sid, self.middles[len(body)], sid, body)
        self.chunk = b"".join(parts)
        self.data = [0, *accumulate(len(frames[pick]) for pick in picks)]
        self.ends = [data + i * size for i, data in enumerate(self.data)]

    def fit(self, room: int, window: int) -> int:
        """How many of the next requests fit in `room` streams and `window` DATA bytes."""
        pos, last = self.pos, min(self.pos + room, CHUNK)
        return bisect_right(self.data, self.data[pos] + window, pos, last + 1) - 1 - pos


class Tally:
    """Latencies of the answers inside the window; errors, with the first reason."""

    def __init__(self) -> None:
        self.start = self.end = 0.0
        self.latencies, self.errors, self.first_error = array("d"), 0, ""
        self.good: set[bytes] = set()  # trailers seen to carry grpc-status 0
        self.decoder = hpack.Decoder()
        self.decoder.header_table_size = 0  # as our SETTINGS asked of the server's encoder

    def fail(self, count: int, reason: str) -> None:
        self.errors += count
        self.first_error = self.first_error or reason

    def record(self, took: float, now: float, error: str) -> None:
        if self.start <= now <= self.end:
            self.fail(1, error) if error else self.latencies.append(took * 1000)

    def check(self, block: bytes, flags: int) -> str:
        """Why new trailers are not grpc-status 0 ("" if they are)."""
        payload = block[1 : len(block) - block[0]] if flags & f.PADDED else block
        try:
            found = self.decoder.decode(payload[5:] if flags & f.PRIORITY_FLAG else payload, True)
        except hpack.HPACKError as exc:
            return f"undecodable trailers: {exc}"
        fields = {bytes(k).decode(): bytes(v).decode(errors="replace") for k, v in found}
        if (status := fields.get("grpc-status", f"none (HTTP {fields.get(':status')})")) == "0":
            self.good.add(block)
            return ""
        return f"grpc-status {status}: {fields.get('grpc-message', '')}"


class Conn:
    """One connection: at most `limit` streams in flight, DATA within the server's connection
    window (each stream's one DATA frame fits its initial window, checked at its SETTINGS)."""

    def __init__(self, sock: socket.socket, requests: Requests, streams: int, tally: Tally) -> None:
        self.sock, self.requests, self.streams, self.tally = sock, requests, streams, tally
        self.out, self.inbuf = bytearray(HELLO), b""
        self.started: dict[int, float] = {}  # stream id -> when sent
        self.bad: set[int] = set()  # streams whose answer was not OK
        self.limit, self.window, self.received = 0, f.DEFAULT_WINDOW, 0
        # open: may send; closed: nor read (EOF); events: what the selector waits for
        self.open, self.closed, self.events = True, False, READ | WRITE

    def read(self, now: float) -> None:
        try:
            data = self.sock.recv(1 << 18)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        buf = self.inbuf + data if self.inbuf else data
        self.inbuf = buf[self.parse(buf, now) :]
        if not data:
            self.lost("connection closed or failed", closed=True)
        elif self.received > WINDOW // 2:
            self.out += f.window_update(0, self.received)
            self.received = 0

    def parse(self, buf: bytes, now: float) -> int:
        """Handles the complete frames in `buf` (an OK answer in the window inline: this is
        the client's hot loop); where the rest begins."""
        at, size, started, bad, good = 0, len(buf), self.started, self.bad, self.tally.good
        counted, latencies = self.tally.start <= now <= self.tally.end, self.tally.latencies
        while size - at >= 9:
            high, low, kind, flags, sid = unpack_header(buf, at)
            if (end := at + 9 + (high << 16 | low)) > size:
                break
            if kind == HEADERS and flags & END_STREAM:
                block, sent = buf[at + 9 : end], started.pop(sid, None)
                if counted and sent is not None and block in good and sid not in bad:
                    latencies.append((now - sent) * 1000)
                elif sent is not None:
                    self.answered(sid, sent, block, flags, now)
            elif kind == DATA:
                self.received += end - at - 9
                if end - at < 16 or buf[at + 14] != 0x08 or buf[at + 15] != 0x01:
                    bad.add(sid)  # not overall_code (field 1) = OK (1)
            elif kind != HEADERS:
                self.control(kind, flags, sid, buf[at + 9 : end], now)
            at = end
        return at

    def answered(self, sid: int, sent: float, block: bytes, flags: int, now: float) -> None:
        error = "" if block in self.tally.good else self.tally.check(block, flags)
        if sid in self.bad:
            self.bad.discard(sid)
            error = error or "overall_code not OK"
        self.tally.record(now - sent, now, error)

    def control(self, kind: int, flags: int, sid: int, payload: bytes, now: float) -> None:
        code = int.from_bytes(payload[4:8] if kind == f.GOAWAY else payload[:4])
        if kind == f.SETTINGS and not flags & f.ACK:
            self.settings(dict(struct.iter_unpack("!HL", payload[: len(payload) // 6 * 6])))
        elif kind == f.PING and not flags & f.ACK:
            self.out += f.frame(f.PING, f.ACK, 0, payload)
        elif kind == f.WINDOW_UPDATE and sid == 0:
            self.window += code & 0x7FFFFFFF
        elif kind == f.RST_STREAM and self.started.pop(sid, None) is not None:
            self.tally.record(0.0, now, f"stream reset, code {code}")
        elif kind == f.GOAWAY:
            reason = payload[8:].decode(errors="replace")
            self.lost(f"GOAWAY, code {code}: {reason}", int.from_bytes(payload[:4]))

    def settings(self, peer: dict[int, int]) -> None:
        largest = max(map(len, self.requests.frames))
        if peer.get(f.SETTINGS_INITIAL_WINDOW_SIZE, f.DEFAULT_WINDOW) < largest:
            raise RuntimeError("the server's stream window is smaller than a request's body")
        self.limit = min(self.streams, peer.get(f.SETTINGS_MAX_CONCURRENT_STREAMS, self.streams))
        self.out += f.frame(f.SETTINGS, f.ACK, 0)

    def lost(self, reason: str, last_stream: int = 0, *, closed: bool = False) -> None:
        """No more requests here (`closed`: nor answers); those the server will not answer
        are errors, or the event itself one if none are."""
        gone = [sid for sid in self.started if sid > last_stream]
        for sid in gone:
            del self.started[sid]
        if count := len(gone) or int(self.open):
            self.tally.fail(count, reason)
        self.open, self.closed = False, self.closed or closed

    def fill(self, now: float) -> None:
        """As many requests as streams and window allow, one slice per chunk."""
        reqs = self.requests
        while self.open and (room := self.limit - len(self.started)) > 0:
            if reqs.pos == CHUNK and reqs.sent < MAX_REQUESTS // reqs.stride:
                reqs.encode()
            if (k := reqs.fit(room, self.window)) <= 0:
                return
            a, b = reqs.pos, reqs.pos + k
            self.out += reqs.chunk[reqs.ends[a] : reqs.ends[b]]
            self.window -= reqs.data[b] - reqs.data[a]
            first = 2 * (reqs.base + a) + 1
            self.started.update(dict.fromkeys(range(first, first + 2 * k, 2), now))
            reqs.pos = b

    def flush(self, selector: selectors.BaseSelector) -> None:
        if self.out and not self.closed:
            try:
                del self.out[: self.sock.send(self.out)]
            except BlockingIOError:
                pass
            except OSError as exc:
                self.lost(f"connection failed: {exc}", closed=True)
        events = 0 if self.closed else READ | (WRITE if self.out else 0)
        if events != self.events:
            selector.modify(self.sock, events, self) if events else selector.unregister(self.sock)
            self.events = events


def connect(cfg: dict[str, Any], frames: list[bytes], index: int, tally: Tally) -> Conn:
    host, port = cfg["address"].rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5.0)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    block, first = header_block(cfg["path"], cfg["address"]), cfg.get("offset", 0) + index
    (requests := Requests(frames, block, first, cfg["connections"])).encode()
    return Conn(sock, requests, cfg["streams"], tally)


def serve(conns: list[Conn], selector: selectors.BaseSelector, tally: Tally) -> None:
    """Loads until the window ends, then awaits the answers in flight (DRAIN_S at most)."""
    now = time.perf_counter()
    while now < tally.end or (now < tally.end + DRAIN_S and any(c.started for c in conns)):
        events = selector.select(0.01)
        now = time.perf_counter()  # when these answers came, and the next requests leave
        for key, mask in events:
            if mask & READ:
                key.data.read(now)
            if now < tally.end:
                key.data.fill(now)
            key.data.flush(selector)


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    frames, selector, tally = load_frames(cfg["frames"]), selectors.DefaultSelector(), Tally()
    conns = [connect(cfg, frames, c, tally) for c in range(cfg["connections"])]
    tally.start = time.perf_counter() + cfg["settleS"]
    tally.end = tally.start + cfg["durationS"]
    for conn in conns:
        selector.register(conn.sock, conn.events, conn)
    serve(conns, selector, tally)
    for conn in conns:
        conn.sock.close()
    Path(cfg["latencyFile"]).write_bytes(tally.latencies.tobytes())
    fewest = min(conn.requests.sent for conn in conns)  # the next run repeats what others sent
    return {
        "requests": len(tally.latencies), "errors": tally.errors, "first_error": tally.first_error,
        "sent": sum(conn.requests.sent for conn in conns),
        "next_offset": (cfg.get("offset", 0) + fewest * len(conns)) % len(frames),
    }  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))), flush=True)

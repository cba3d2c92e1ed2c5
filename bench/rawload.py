"""A closed-loop gRPC load generator in one process (HTTP/2 by hand on stdlib sockets) that keeps
the fast transport's core busy while cycling through 100,000 distinct bodies. Config (JSON):
address, path, frames, offset, connections, streams, settleS, durationS, latencyFile.

Connection c sends body offset + c + j * connections of `frames` (back-to-back gRPC frames) on
stream 2j + 1. An answer is OK if its DATA starts with overall_code OK and its trailers carry
grpc-status 0. Prints one JSON line; writes the latencies (float64 ms) of the answers inside
the window to latencyFile.
"""

from __future__ import annotations

import json
import selectors
import socket
import struct
import sys
import time
from array import array
from pathlib import Path
from typing import Any

import hpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the checkout
from harness import h2frames as f

WINDOW = f.MAX_WINDOW  # ours, per stream and for the connection: the server never waits on us
SETTINGS = {f.SETTINGS_HEADER_TABLE_SIZE: 0, f.SETTINGS_INITIAL_WINDOW_SIZE: WINDOW}
HELLO = f.PREFACE + f.settings(SETTINGS) + f.window_update(0, WINDOW - f.DEFAULT_WINDOW)
DRAIN_S = 2.0  # after the window, answers still due are awaited this long at most
# per run, over all connections; their answers' DATA (< 100 bytes each) stays within WINDOW
MAX_REQUESTS = 20_000_000
DATA, HEADERS, END_STREAM = f.DATA, f.HEADERS, f.END_STREAM  # globals: read per frame
unpack_header = f.FRAME_HEADER.unpack_from


def load_frames(path: str) -> list[bytes]:
    data, found, at = Path(path).read_bytes(), [], 0
    while at < len(data):
        found.append(data[at : (at := at + 5 + int.from_bytes(data[at + 1 : at + 5]))])
    if not found or max(map(len, found)) > f.DEFAULT_FRAME_SIZE:
        raise ValueError(f"{path}: no frames, or one over {f.DEFAULT_FRAME_SIZE} bytes")
    return found


def header_blocks(path: str, authority: str) -> tuple[bytes, bytes]:
    """A connection's first request's block, which adds its fields to the server's dynamic
    table, and every later one's: indexes into it, as Envoy and h2load send them."""
    encoder = hpack.Encoder()
    fields = [
        (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", authority),
        ("content-type", "application/grpc"), ("te", "trailers"),
    ]  # fmt: skip
    return encoder.encode(fields), encoder.encode(fields)


class Requests:
    """A connection's requests: the j-th (`sent` so far) is body first + j * stride on stream
    2j + 1, as a HEADERS frame (`blocks`: the first request's, the later ones') and one DATA."""

    def __init__(
        self, frames: list[bytes], blocks: tuple[bytes, bytes], first: int, stride: int
    ) -> None:
        self.frames, self.first, self.stride, self.sent = frames, first, stride, 0
        self.last = MAX_REQUESTS // stride
        sizes = {*map(len, frames)}
        # the frame headers but their stream ids: HEADERS's before, DATA's after the block
        self.parts = [
            (f.frame(f.HEADERS, f.END_HEADERS, 0, block)[:5],
             {n: block + f.frame(DATA, END_STREAM, 0, bytes(n))[:5] for n in sizes})
            for block in blocks
        ]  # fmt: skip

    def take(self, room: int, window: int) -> tuple[bytes, int]:
        """The next requests, at most `room` of them with at most `window` DATA bytes: their
        frames and DATA bytes."""
        parts: list[bytes] = []
        frames, used, count = self.frames, 0, len(self.frames)
        for j in range(self.sent, min(self.sent + room, self.last)):
            body = frames[(self.first + j * self.stride) % count]
            if used + len(body) > window:
                break
            sid, (head, middles) = (2 * j + 1).to_bytes(4), self.parts[j > 0]
            parts += (head, sid, middles[len(body)], sid, body)
            used += len(body)
        self.sent += len(parts) // 5
        return b"".join(parts), used


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

    def error(self, now: float, reason: str) -> None:
        if self.start <= now <= self.end:
            self.fail(1, reason)

    def check(self, block: bytes) -> str:
        """Why trailers are not grpc-status 0 ("" if they are)."""
        if block in self.good:
            return ""
        if not (why := trailers_error(self.decoder, block)):
            self.good.add(block)
        return why


def trailers_error(decoder: hpack.Decoder, block: bytes) -> str:
    """Why a trailers block is not grpc-status 0 ("" if it is). Servers here neither pad nor
    prioritise: a block that is, is undecodable."""
    try:
        found = decoder.decode(block, True)
    except hpack.HPACKError as exc:
        return f"undecodable trailers: {exc}"
    fields = {bytes(k).decode(): bytes(v).decode(errors="replace") for k, v in found}
    if (status := fields.get("grpc-status", f"none (HTTP {fields.get(':status')})")) == "0":
        return ""
    return f"grpc-status {status}: {fields.get('grpc-message', '')}"


class Conn:
    """One connection: at most `limit` streams in flight, DATA within the server's connection
    window (each stream's one DATA frame fits its initial window, checked at its SETTINGS)."""

    def __init__(self, cfg: dict[str, Any], frames: list[bytes], index: int, tally: Tally) -> None:
        host, port = cfg["address"].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5.0)  # bounds a send
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        blocks, first = header_blocks(cfg["path"], cfg["address"]), cfg.get("offset", 0) + index
        self.requests = Requests(frames, blocks, first, cfg["connections"])
        self.streams, self.tally = cfg["streams"], tally
        self.out, self.inbuf = bytearray(HELLO), b""
        self.started: dict[int, float] = {}  # stream id -> when sent (> 0: pop(sid, 0.0))
        self.limit, self.window = 0, f.DEFAULT_WINDOW
        self.open, self.closed = True, False  # open: may send; closed: nor read (EOF)

    def read(self, now: float) -> None:
        try:
            data = self.sock.recv(1 << 18)
        except OSError:
            data = b""
        buf = self.inbuf + data if self.inbuf else data
        self.inbuf = buf[self.parse(buf, now) :]
        if not data:
            self.lost("connection closed or failed", closed=True)

    def parse(self, buf: bytes, now: float) -> int:
        """Handles the complete frames in `buf` (answers inline: this is the client's hot
        loop); where the rest begins."""
        at, size, started, tally = 0, len(buf), self.started, self.tally
        counted = tally.start <= now <= tally.end
        while size - at >= 9:
            high, low, kind, flags, sid = unpack_header(buf, at)
            if (end := at + 9 + (high << 16 | low)) > size:
                break
            if kind == HEADERS and flags & END_STREAM and (sent := started.pop(sid, 0.0)):
                if error := tally.check(buf[at + 9 : end]):
                    tally.error(now, error)
                elif counted:
                    tally.latencies.append((now - sent) * 1000)
            elif kind == DATA and (end - at < 16 or buf[at + 14] != 0x08 or buf[at + 15] != 0x01):
                if started.pop(sid, 0.0):  # not overall_code (field 1) = OK (1)
                    tally.error(now, "overall_code not OK")
            elif kind not in (DATA, HEADERS):
                self.control(kind, flags, sid, buf[at + 9 : end], now)
            at = end
        return at

    def control(self, kind: int, flags: int, sid: int, payload: bytes, now: float) -> None:
        code = int.from_bytes(payload[4:8] if kind == f.GOAWAY else payload[:4])
        if kind == f.SETTINGS and not flags & f.ACK:
            self.settings(dict(struct.iter_unpack("!HL", payload[: len(payload) // 6 * 6])))
        elif kind == f.PING and not flags & f.ACK:
            self.out += f.frame(f.PING, f.ACK, 0, payload)
        elif kind == f.WINDOW_UPDATE and sid == 0:
            self.window += code & 0x7FFFFFFF
        elif kind == f.RST_STREAM and self.started.pop(sid, 0.0):
            self.tally.error(now, f"stream reset, code {code}")
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
        """As many requests as free streams and the window allow, in one slice."""
        if self.open and (room := self.limit - len(self.started)) > 0:
            first = 2 * self.requests.sent + 1
            wire, used = self.requests.take(room, self.window)
            self.out += wire
            self.window -= used
            self.started.update(dict.fromkeys(range(first, 2 * self.requests.sent + 1, 2), now))

    def flush(self) -> None:
        """Sends what is due in one call: it never waits long, as no more than `limit`
        requests' bytes are ever unread by the server."""
        if self.out and not self.closed:
            try:
                self.sock.sendall(self.out)
            except OSError as exc:
                self.lost(f"connection failed: {exc}", closed=True)
        self.out.clear()


def serve(conns: list[Conn], selector: selectors.BaseSelector, tally: Tally) -> None:
    """Loads until the window ends, then awaits the answers in flight (DRAIN_S at most)."""
    now = time.perf_counter()
    while now < tally.end or (now < tally.end + DRAIN_S and any(c.started for c in conns)):
        events = selector.select(0.01)
        now = time.perf_counter()  # when these answers came, and the next requests leave
        for key, _ in events:
            key.data.read(now)
            if now < tally.end:
                key.data.fill(now)
            key.data.flush()
            if key.data.closed:
                selector.unregister(key.fileobj)


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    frames, selector, tally = load_frames(cfg["frames"]), selectors.DefaultSelector(), Tally()
    conns = [Conn(cfg, frames, c, tally) for c in range(cfg["connections"])]
    tally.start = time.perf_counter() + cfg["settleS"]
    tally.end = tally.start + cfg["durationS"]
    for conn in conns:
        conn.flush()
        selector.register(conn.sock, selectors.EVENT_READ, conn)
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

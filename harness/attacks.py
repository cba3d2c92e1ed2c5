"""The attacks of the transport's abuse issue on a real sidecar process's gRPC port, each measured
alike: the process's resident memory (VmRSS) before and at its peak, other clients' ShouldRateLimit
latencies on a connection of their own meanwhile, and what the attacking connections got back
(GOAWAY, how each stream ended). tests/integration/test_transport_abuse.py asserts on what they
return; `python -m bench abuse` prints it, per source tree.

Every attack is bounded in frames and in seconds, and speaks to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import resource
import selectors
import socket
import ssl
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1.health_pb2_grpc import HealthStub

from harness import h2frames as f
from harness.grpc_client import request, rls_stub
from harness.h2raw import End, Frame, RawH2, Tally
from harness.process import NotReady, python_module, wait_ready
from harness.rules import write_rules
from harness.sidecar import SidecarProcess
from harness.xds_certs import Pki, make_pki
from ratelimit_sidecar.grpc_server.protocol.frames import ErrorCode

BODY = request("gateway", [("tier", "internal")]).SerializeToString()  # unlimited: always OK
OTHERS = request("gateway", [("tier", "other")])
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"
WATCH_BODY = health_pb2.HealthCheckRequest().SerializeToString()
CALL_TIMEOUT_S = 2.0  # an other client's call: longer is a failure
PROBE_INTERVAL_S = 0.01
PROBE_MAX_CALLS = 2_000
PROBE_GRACE_S = 3.0  # after the attack, the probe stops within this even if calls hang
SAMPLE_S = 0.1
HANDSHAKE_WAIT_S = 0.5  # for an idle connection's SETTINGS from the server
MIB = 1 << 20
ZEROS = bytes(f.DEFAULT_FRAME_SIZE)


@dataclass(frozen=True)
class Target:
    """A sidecar's plaintext gRPC port and its process (one worker: the process serving)."""

    port: int
    pid: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def rss_kib(pid: int) -> int:
    """VmRSS of the process in KiB; 0 once it is gone."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered)) - 1))]


# -- beside an attack: memory, and the other clients ------------------------------------------


class Watch:
    """The target's peak VmRSS, sampled, and (with `probe`) other clients' ShouldRateLimit calls,
    one at a time on a grpcio connection of their own, until the attack ended and at least
    `min_calls` were made (or PROBE_GRACE_S passed: a stalled server does not hold the test)."""

    def __init__(self, target: Target, min_calls: int = 20, probe: bool = True) -> None:
        self.target, self.min_calls, self.probe = target, min_calls, probe
        self.rss_before = self.rss_peak = rss_kib(target.pid)
        self.latencies_ms: list[float] = []
        self.failures: list[str] = []
        self.ended_at: float | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()
        self.ready.wait(CALL_TIMEOUT_S + 5)  # the probe's connection is up before the attack

    def finish(self) -> None:
        self.sample()
        self.ended_at = time.monotonic()
        self.thread.join(PROBE_GRACE_S + CALL_TIMEOUT_S + 5)

    def sample(self) -> None:
        self.rss_peak = max(self.rss_peak, rss_kib(self.target.pid))

    def hold(self, seconds: float) -> None:
        """Wait `seconds`, sampling memory: what the attack left in the process shows."""
        for _ in range(round(seconds / SAMPLE_S)):
            self.sample()
            time.sleep(SAMPLE_S)

    def _done(self) -> bool:
        if len(self.latencies_ms) >= PROBE_MAX_CALLS:
            return True
        ended = self.ended_at
        return ended is not None and (
            len(self.latencies_ms) >= self.min_calls or time.monotonic() > ended + PROBE_GRACE_S
        )

    def _run(self) -> None:
        if not self.probe:
            self.ready.set()
            while not self._done():
                self.sample()
                time.sleep(SAMPLE_S)
            return
        with grpc.insecure_channel(self.target.address, options=LOCAL_POOL) as channel:
            self._probe(rls_stub(channel))

    def _probe(self, stub: Any) -> None:
        with contextlib.suppress(grpc.RpcError):  # the connection's set-up is not measured
            stub.ShouldRateLimit(OTHERS, timeout=CALL_TIMEOUT_S)
        self.ready.set()
        while not self._done():
            self.sample()
            self.latencies_ms.append(timed_call(stub, self.failures))
            time.sleep(PROBE_INTERVAL_S)


LOCAL_POOL = (("grpc.use_local_subchannel_pool", 1),)  # a connection of its own, not shared


def timed_call(stub: Any, failures: list[str]) -> float:
    """One ShouldRateLimit's latency in ms (a failed one's too), its status added to `failures`."""
    started = time.monotonic()
    try:
        stub.ShouldRateLimit(OTHERS, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        failures.append(exc.code().name)
    return (time.monotonic() - started) * 1000


@contextlib.contextmanager
def watching(target: Target, min_calls: int = 20, probe: bool = True) -> Iterator[Watch]:
    watch = Watch(target, min_calls, probe)
    watch.start()
    try:
        yield watch
    finally:
        watch.finish()


# -- what an attack observed ------------------------------------------------------------------


@dataclass
class Observed:
    """What one attack did to the process, and what its connections got back."""

    rss_before_kib: int = 0
    rss_peak_kib: int = 0
    others_ms: list[float] = field(default_factory=list)
    others_failed: list[str] = field(default_factory=list)
    goaway: int | None = None  # the first GOAWAY code the attacking connections got
    ends: list[End] = field(default_factory=list)  # the attack's streams the server ended
    unended: int = 0  # the attack's streams still open when it stopped
    notes: list[str] = field(default_factory=list)
    pings_acked: int = 0

    @classmethod
    def of(
        cls, watch: Watch, tallies: Sequence[Tally], streams: int = 0, notes: Sequence[str] = ()
    ) -> Observed:
        ends = [end for tally in tallies for end in tally.ends.values()]
        goaways = [tally.goaway.error_code for tally in tallies if tally.goaway is not None]
        return cls(
            watch.rss_before, watch.rss_peak, watch.latencies_ms, watch.failures,
            goaways[0] if goaways else None, ends, max(0, streams - len(ends)), list(notes),
            sum(len(tally.pings) for tally in tallies),
        )  # fmt: skip

    @property
    def rss_growth_mb(self) -> float:
        return (self.rss_peak_kib - self.rss_before_kib) * 1024 / 1e6

    def others(self, pct: float) -> float | None:
        return percentile(self.others_ms, pct)

    def outcome(self) -> str:
        return "; ".join(self.parts()) or "no answer"

    def parts(self) -> list[str]:
        """GOAWAY, the streams' ends counted by kind, those left open, and the notes."""
        parts = [] if self.goaway is None else [f"GOAWAY {f.code_name(self.goaway)}"]
        parts += [f"{n:,}x {what}" for what, n in Counter(map(str, self.ends)).most_common()]
        parts += [f"{self.unended:,} stream(s) still open"] if self.unended else []
        return [*parts, *self.notes]

    def __str__(self) -> str:
        p50, p99 = self.others(50), self.others(99)
        others = "-" if p50 is None else f"p50 {p50:.1f} ms, p99 {p99:.1f} ms"
        failed = dict(Counter(self.others_failed))
        return (
            f"RSS +{self.rss_growth_mb:.1f} MB; others: {others} over {len(self.others_ms)} "
            f"calls, failed {failed}; outcome: {self.outcome()}"
        )


class Sender:
    """`data` written by a thread of its own while the caller reads the server's answers (the
    server answers as it reads); a connection the server ended stops it quietly."""

    def __init__(self, raw: RawH2, data: bytes) -> None:
        self.raw, self.data, self.error = raw, data, ""
        self.thread = threading.Thread(target=self._send, daemon=True)
        self.thread.start()

    def _send(self) -> None:
        try:
            self.raw.send(self.data)
        except OSError as exc:
            self.error = f"sending stopped: {exc.__class__.__name__}"

    def join(self, timeout_s: float = 5.0) -> str:
        """Empty once all was sent, else why not."""
        self.thread.join(timeout_s)
        return "sending still blocked" if self.thread.is_alive() else self.error


def settle(raw: RawH2, tally: Tally, burst: bytes, timeout_s: float) -> list[str]:
    """`burst`, then a PING whose ACK says the server handled every frame before it; read until
    that ACK, a GOAWAY, the connection's end or `timeout_s`. Notes on what did not happen."""
    token = os.urandom(8)  # this PING's own: an earlier settle's ACK does not count
    sender = Sender(raw, burst + f.ping(token))
    tally.until(lambda t: token in t.pings or t.goaway is not None, timeout_s)
    notes = [note] if (note := sender.join()) else []
    if token not in tally.pings and tally.goaway is None:
        notes.append(f"not handled within {timeout_s:g} s")
    return notes


# -- 1: a half-closed stream reopened ----------------------------------------------------------


def watch_reopened(target: Target, frames: int = 30_000) -> Observed:
    """One Health/Watch call, then `frames` empty HEADERS with END_STREAM on its stream (~270 KB):
    the stream is half-closed (remote), where RFC 9113 §5.1 makes a HEADERS a STREAM_CLOSED error.
    """
    raw = RawH2(target.port)
    with contextlib.closing(raw), watching(target) as watch:
        raw.send(raw.call(1, WATCH_BODY, path=HEALTH_WATCH))
        tally = Tally(raw)
        tally.until(lambda t: 1 in t.responses, 5)  # its response headers: the handler runs
        reopen = f.frame(f.HEADERS, f.END_STREAM | f.END_HEADERS, 1)
        notes = settle(raw, tally, reopen * frames, 15)
        watch.hold(1.0)
    return Observed.of(watch, [tally], notes=notes)


# -- 2: SETTINGS that touch every open stream ---------------------------------------------------


def settings_flood(
    target: Target, streams: int = 1_000, frames: int = 64, entries: int = 2_730
) -> Observed:
    """`streams` open streams (as many as the server advertises, if fewer), then `frames` SETTINGS
    frames of `entries` SETTINGS_INITIAL_WINDOW_SIZE each (~1 MB), alternating between two values:
    applied entry by entry, each one changes every open stream's window."""
    raw = RawH2(target.port)
    with contextlib.closing(raw):
        limit = raw.advertised().get(f.SETTINGS_MAX_CONCURRENT_STREAMS, streams)
        opened, tally = min(streams, limit), Tally(raw)
        settle(raw, tally, b"".join(raw.headers(1 + 2 * i) for i in range(opened)), 10)
        values = [
            (f.SETTINGS_INITIAL_WINDOW_SIZE, f.DEFAULT_WINDOW + i % 2) for i in range(entries)
        ]
        acked = tally.settings_acks  # of the client's first SETTINGS
        with watching(target, min_calls=100) as watch:  # p99 of 100: one outlier is not it
            notes = settle(raw, tally, f.settings_entries(values) * frames, 10)
    acks = f"{tally.settings_acks - acked} of {frames} SETTINGS acknowledged"
    return Observed.of(watch, [tally], notes=[f"{opened:,} streams open", acks, *notes])


# -- 3: request messages that never finish ------------------------------------------------------


class Polled:
    """A connection read without blocking, among many (an upload, an idle connection): its frames
    go to its Tally, after `_frame` saw them."""

    def __init__(self, port: int, timeout_s: float = 10.0) -> None:
        self.raw = RawH2(port, timeout_s=timeout_s)
        self.tally = Tally(self.raw)

    def receive(self) -> None:
        try:
            chunk = self.raw.sock.recv(1 << 18)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        self.tally.closed = not chunk
        self.raw.feed(chunk)
        self.drain()

    def drain(self) -> None:
        """The frames received and not yet seen (some may have come with the server's SETTINGS)."""
        while (frame := self.raw.buffered()) is not None:
            self._frame(frame)
            self.tally.take(frame)

    def _frame(self, frame: Frame) -> None:
        pass


def poll(
    members: Sequence[Polled], seconds: float, each_turn: Callable[[], bool] = lambda: False
) -> None:
    """Read every member as frames come, for `seconds` or until `each_turn()` (called after each
    turn of reads) says done, or all were closed."""
    with selectors.DefaultSelector() as selector:
        for member in members:
            if not member.tally.closed:
                selector.register(member.raw.sock, selectors.EVENT_READ, member)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and selector.get_map():
            for key, _ in selector.select(0.005):
                key.data.receive()
                if key.data.tally.closed:
                    selector.unregister(key.fileobj)
            if each_turn():
                return


class Upload(Polled):
    """One connection whose `streams` each announce an `announced`-byte message and send what
    the server's flow-control windows allow, never finishing it."""

    def __init__(self, port: int, streams: int, announced: int) -> None:
        super().__init__(port)
        initial = self.raw.advertised().get(f.SETTINGS_INITIAL_WINDOW_SIZE, f.DEFAULT_WINDOW)
        self.prefix, self.total = b"\0" + announced.to_bytes(4, "big"), 5 + announced
        self.order = [1 + 2 * i for i in range(streams)]
        self.windows = dict.fromkeys(self.order, initial)
        self.left = dict.fromkeys(self.order, self.total)  # bytes of the message unsent
        self.conn_window, self.cursor, self.sent = f.DEFAULT_WINDOW, 0, 0
        self.out = bytearray(f.settings_ack() + b"".join(map(self.raw.headers, self.order)))
        self.raw.sock.setblocking(False)
        self.drain()

    def _frame(self, frame: Frame) -> None:
        if frame.kind != f.WINDOW_UPDATE:
            return
        increment = int.from_bytes(frame.payload[:4], "big") & 0x7FFFFFFF
        if frame.stream_id == 0:
            self.conn_window += increment
        elif frame.stream_id in self.windows:
            self.windows[frame.stream_id] += increment

    def pump(self) -> None:
        """DATA frames as the windows allow (a bounded backlog), then what the socket takes."""
        while len(self.out) < 4 * f.DEFAULT_FRAME_SIZE and (data := self._next_data()):
            self.out += data
        if self.out and not self.tally.closed:
            with contextlib.suppress(BlockingIOError, OSError):
                del self.out[: self.raw.sock.send(self.out)]

    def _next_data(self) -> bytes:
        if self.conn_window <= 0 or self.tally.goaway is not None:
            return b""
        for _ in self.order:  # round robin over the streams still sending
            sid = self.order[self.cursor]
            self.cursor = (self.cursor + 1) % len(self.order)
            size = min(f.DEFAULT_FRAME_SIZE, self.windows[sid], self.conn_window, self.left[sid])
            if size > 0 and sid not in self.tally.ends:
                return self._data(sid, size)
        return b""

    def _data(self, sid: int, size: int) -> bytes:
        offset = self.total - self.left[sid]  # the first frame carries the message's prefix
        payload = (self.prefix[offset:] + ZEROS)[:size] if offset < 5 else ZEROS[:size]
        self.left[sid] -= size
        self.windows[sid] -= size
        self.conn_window -= size
        self.sent += size
        return f.frame(f.DATA, 0, sid, payload)


def drive(started: Sequence[Upload], seconds: float) -> None:
    """Each upload's reads and writes as they can go, for `seconds`."""

    def pump_all() -> bool:
        for upload in started:
            upload.pump()
        return False

    poll(started, seconds, pump_all)


def uploads(
    target: Target,
    connections: int = 16,
    streams: int = 16,
    announced: int = 4 * MIB,
    seconds: float = 8.0,
) -> Observed:
    """`connections` x `streams` streams each announcing an `announced`-byte message, sending what
    the windows allow for `seconds`, never finishing (offered: 1 GiB by default)."""
    with watching(target) as watch:
        started = [Upload(target.port, streams, announced) for _ in range(connections)]
        try:
            drive(started, seconds)
            watch.sample()  # what the process holds while the uploads are still open
        finally:
            for upload in started:
                upload.raw.close()
    sent, offered = sum(u.sent for u in started), connections * streams * (5 + announced)
    notes = [f"{sent / 1e6:,.0f} MB sent of {offered / 1e6:,.0f} MB offered"]
    return Observed.of(watch, [u.tally for u in started], connections * streams, notes)


def huge_prefix(target: Target, announced: int = MIB) -> Observed:
    """One stream whose message prefix announces `announced` bytes, then 100 of them."""
    raw = RawH2(target.port)
    with contextlib.closing(raw), watching(target) as watch:
        start = b"\0" + announced.to_bytes(4, "big") + b"x" * 100
        raw.send(raw.headers(1), raw.data(1, start, end_stream=False))
        tally = Tally(raw)
        tally.until(lambda t: 1 in t.ends or t.goaway is not None, 3)
    return Observed.of(watch, [tally], streams=1)


# -- 4: streams that never finish, without grpc-timeout ---------------------------------------


def stalled_streams(
    target: Target, headers_only: int = 8, half_messages: int = 8, wait_s: float = 5.0
) -> Observed:
    """Unary calls that never finish, no grpc-timeout: `headers_only` with HEADERS alone,
    `half_messages` with half of their one message; read for `wait_s` or until all ended."""
    raw = RawH2(target.port)
    ids = [1 + 2 * i for i in range(headers_only + half_messages)]
    half = b"\0" + (100).to_bytes(4, "big") + b"x" * 50
    burst = b"".join(
        raw.headers(sid) + (raw.data(sid, half, end_stream=False) if i >= headers_only else b"")
        for i, sid in enumerate(ids)
    )
    with contextlib.closing(raw), watching(target) as watch:
        raw.send(burst)
        tally = Tally(raw)
        tally.until(lambda t: t.goaway is not None or all(s in t.ends for s in ids), wait_s)
    return Observed.of(watch, [tally], streams=len(ids))


# -- 6, 7: flow-control overflow, a preface without SETTINGS ------------------------------------


def window_overflow(target: Target) -> Observed:
    """WINDOW_UPDATE raising an open stream's send window to 2^31-1, then SETTINGS raising the
    initial window by one: RFC 9113 §6.9.2 makes it a connection error FLOW_CONTROL_ERROR."""
    raw = RawH2(target.port)
    with contextlib.closing(raw), watching(target) as watch:
        raise_by = f.MAX_WINDOW - f.DEFAULT_WINDOW
        one_more = f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: f.DEFAULT_WINDOW + 1})
        raw.send(raw.headers(1), f.window_update(1, raise_by), one_more)
        tally = Tally(raw)
        tally.until(lambda t: t.goaway is not None, 3)
    return Observed.of(watch, [tally])


def ping_first(target: Target) -> Observed:
    """The client preface followed by a PING, not SETTINGS (RFC 9113 §3.4: PROTOCOL_ERROR)."""
    raw = RawH2(target.port, preface=False)
    with contextlib.closing(raw), watching(target) as watch:
        raw.send(f.PREFACE + f.ping())
        tally = Tally(raw)
        tally.until(lambda t: t.goaway is not None, 3)
    return Observed.of(watch, [tally])


# -- 8: a control-frame flood with requests interleaved; keepalive PINGs -----------------------


CONTROL_FRAMES: dict[str, Callable[[int], bytes]] = {  # each after the call on stream `sid`
    "ping": lambda _sid: f.ping(),
    "settings": lambda _sid: f.settings({}),
    "window_update": lambda _sid: f.window_update(0, 1),
    "rst_stream": lambda sid: f.rst_stream(sid, ErrorCode.CANCEL),  # the call's, answered
}


def interleaved_flood(target: Target, control: str = "ping", pairs: int = 20_000) -> Observed:
    """`pairs` times a valid ShouldRateLimit call then one `control` frame: answered calls must
    not buy the flood an endless budget."""
    raw, make = RawH2(target.port), CONTROL_FRAMES[control]
    ids = [1 + 2 * i for i in range(pairs)]
    burst = b"".join(raw.call(sid, BODY) + make(sid) for sid in ids)
    with contextlib.closing(raw), watching(target) as watch:
        tally, sender = Tally(raw), Sender(raw, burst)
        tally.until(lambda t: t.goaway is not None or len(t.ends) >= pairs, 20)
        notes = [note] if (note := sender.join(1)) else []
    answered = f"{len(tally.ends):,} of {pairs:,} calls answered"
    return Observed.of(watch, [tally], notes=[answered, *notes])


def keepalive(target: Target, seconds: int = 4) -> Observed:
    """A PING and a call each second for `seconds`: a keepalive, not a flood."""
    raw = RawH2(target.port)
    with contextlib.closing(raw), watching(target) as watch:
        tally = Tally(raw)
        for i in range(seconds):
            raw.send(raw.call(1 + 2 * i, BODY), f.ping(b"alive%03d" % i))
            tally.until(lambda t: t.goaway is not None, 1.0)  # reads for the second
    acks = f"{len(tally.pings)} of {seconds} PINGs acknowledged"
    return Observed.of(watch, [tally], streams=seconds, notes=[acks])


# -- 5: idle connections up to the descriptor limit ---------------------------------------------


class Idle(Polled):
    """One idle connection of a crowd: handshaken once the server's SETTINGS came (acknowledged,
    as a client does), then silent. Waiting up to `wait_s` for them when opened makes the
    connections' last activity follow the order they were opened in."""

    def __init__(self, port: int, index: int, wait_s: float) -> None:
        super().__init__(port, timeout_s=1.0)
        self.index, self.handshaken = index, False
        if wait_s > 0:
            with contextlib.suppress(OSError):  # a timeout, or closed before its SETTINGS
                self.raw.advertised(wait_s)
                self._acknowledge()
        self.raw.sock.setblocking(False)
        self.drain()  # what came after the SETTINGS

    def _frame(self, frame: Frame) -> None:
        if frame.kind == f.SETTINGS and not frame.flags & f.ACK and not self.handshaken:
            self._acknowledge()

    def _acknowledge(self) -> None:
        self.handshaken = True
        with contextlib.suppress(OSError):
            self.raw.sock.send(f.settings_ack())


@dataclass
class Crowd(Observed):
    """Attack 5's: the idle connections (indexes in the order opened), and a new connection's
    call once they were all opened."""

    opened: int = 0
    handshaken: int = 0
    evicted: list[int] = field(default_factory=list)  # closed by the server after its GOAWAY
    dropped: list[int] = field(default_factory=list)  # closed by the server without GOAWAY
    newcomer: str = ""  # OK, or the status of the new connection's ShouldRateLimit

    def parts(self) -> list[str]:
        return [
            f"new connection: {self.newcomer}",
            f"{self.handshaken:,} of {self.opened:,} handshaken",
            f"{len(self.evicted):,} closed after GOAWAY, {len(self.dropped):,} without",
            *super().parts(),
        ]


def open_crowd(port: int, count: int) -> tuple[list[Idle], list[str]]:
    """Up to `count` connections opened one after another, each handshaken before the next
    until one is not (then the rest are only opened: a server that stopped accepting does not
    hold the test); a connect that fails ends it."""
    ensure_descriptors(count + 100)
    members: list[Idle] = []
    for index in range(count):
        wait_s = HANDSHAKE_WAIT_S if all(m.handshaken for m in members[-1:]) else 0.0
        try:
            members.append(Idle(port, index, wait_s))
        except OSError as exc:
            return members, [f"connection {index + 1:,} not opened: {exc.__class__.__name__}"]
    return members, []


def ensure_descriptors(count: int) -> None:
    """This process may hold `count` descriptors, if its hard limit allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(count, hard), hard))


def new_connection_call(target: Target) -> tuple[str, float]:
    """A ShouldRateLimit on a new connection: OK or its status, and its latency in ms."""
    failures: list[str] = []
    with grpc.insecure_channel(target.address, options=LOCAL_POOL) as channel:
        latency = timed_call(rls_stub(channel), failures)
    return (failures[0] if failures else "OK"), latency


def crowd(target: Target, idle: int = 1_100, wait_s: float = 3.0) -> Crowd:
    """`idle` connections opened and handshaken, then silent; then a new connection's call."""
    before = rss_kib(target.pid)
    members, notes = open_crowd(target.port, idle)
    try:
        poll(members, wait_s, lambda: all(m.handshaken or m.tally.closed for m in members))
        peak = max(before, rss_kib(target.pid))
        newcomer, latency = new_connection_call(target)
        poll(members, 1.0)  # the connections closed to make room for it
    finally:
        for member in members:
            member.raw.close()
    return crowded(members, Crowd(before, peak, [latency], notes=notes, newcomer=newcomer))


def crowded(members: Sequence[Idle], found: Crowd) -> Crowd:
    closed = [m for m in members if m.tally.closed]
    found.opened, found.handshaken = len(members), sum(m.handshaken for m in members)
    found.evicted = [m.index for m in closed if m.tally.goaway is not None]
    found.dropped = [m.index for m in closed if m.tally.goaway is None]
    found.others_failed = [] if found.newcomer == "OK" else [found.newcomer]
    goaways = [m.tally.goaway.error_code for m in closed if m.tally.goaway is not None]
    found.goaway = goaways[0] if goaways else None
    return found


# -- 9: TLS handshakes that never finish --------------------------------------------------------


@dataclass
class Stalls(Observed):
    """Attack 9's: when the server closed each silent connection (seconds after it opened)."""

    opened: int = 0
    closed_after_s: list[float] = field(default_factory=list)

    def parts(self) -> list[str]:
        if not self.closed_after_s:
            return [f"none of {self.opened} closed", *super().parts()]
        count, latest = len(self.closed_after_s), max(self.closed_after_s)
        return [f"{count} of {self.opened} closed, the last after {latest:.1f} s", *super().parts()]


def tls_stall(target: Target, connections: int = 4, wait_s: float = 4.0) -> Stalls:
    """`connections` TCP connections to the TLS port that send nothing; read for `wait_s`."""
    with watching(target, probe=False) as watch:
        socks = [socket.create_connection(("127.0.0.1", target.port)) for _ in range(connections)]
        try:
            closed = closes(socks, wait_s)
        finally:
            for sock in socks:
                sock.close()
    found = Stalls(watch.rss_before, watch.rss_peak, opened=connections)
    found.closed_after_s = closed
    return found


def closes(socks: Sequence[socket.socket], wait_s: float) -> list[float]:
    """Seconds after which the server closed each of `socks` (those it closed in `wait_s`)."""
    started, closed = time.monotonic(), []
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        while selector.get_map() and (left := started + wait_s - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                if not receive_some(key.fileobj):  # type: ignore[arg-type]
                    closed.append(time.monotonic() - started)
                    selector.unregister(key.fileobj)
    return closed


def receive_some(sock: socket.socket) -> bool:
    """False once the peer closed `sock`."""
    try:
        return bool(sock.recv(4096))
    except OSError:
        return False


# -- the sidecars the attacks run against ------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What an attack's sidecar needs: flags (name, value pairs), a descriptor limit, TLS."""

    flags: tuple[str, ...] = ()
    nofile: int | None = None
    tls: bool = False


# The flags are the contract with the bounded transport; each test passes its own value.
RECEIVE_TIMEOUT_FLAG = "--grpc-receive-timeout-s"
MAX_CONNECTIONS_FLAG = "--grpc-max-connections"
PER_PEER_FLAG = "--grpc-max-connections-per-peer"
TLS_HANDSHAKE_FLAG = "--grpc-tls-handshake-timeout-s"
NARROW_BOUNDS = ("--max-descriptors", "2", "--max-entries", "2", "--max-value-bytes", "64")
WIDE_BOUNDS = ("--max-value-bytes", "4096")  # a 4 MiB request is within the bounds
RECEIVE_1S = (RECEIVE_TIMEOUT_FLAG, "1")
PEER_8 = (PER_PEER_FLAG, "8")
CONNECTIONS_16 = (MAX_CONNECTIONS_FLAG, "16")
TLS_1S = (TLS_HANDSHAKE_FLAG, "1")
# An attack leaves calls that never finish: the drain at its stop gives them 1 s, not 5. Its log
# goes to a pipe read at the end: warnings only, so that it cannot fill it.
QUIET_AND_QUICK = ("--log-level", "warning", "--shutdown-grace-s", "1")
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0  # past the drain and the flush: a stalled sidecar is killed


@dataclass
class Launched:
    process: SidecarProcess
    target: Target
    dropped: list[str]  # flags the tree does not know, left out

    def stop(self) -> int:
        return self.process.stop(timeout_s=STOP_TIMEOUT_S)


def launch(
    setup: Setup,
    workdir: Path,
    *,
    tree: Path | None = None,
    cpus: frozenset[int] | None = None,
    drop_unknown: bool = False,
) -> Launched:
    """A sidecar (fast transport, one worker) on the gateway rules in `workdir`, ready; from the
    source `tree` if given, on `cpus` if given; `drop_unknown` leaves out the flags the tree does
    not know (a tree from before them), else a flag it does not know fails the start."""
    env = {"PYTHONPATH": str(tree)} if tree else {}
    flags, dropped = list(setup.flags), list[str]()
    if drop_unknown:
        flags, dropped = split_flags(setup.flags, known_flags(tree))
    workdir.mkdir(parents=True, exist_ok=True)
    pki = make_pki(workdir / "pki") if setup.tls else None
    tls = (
        []
        if pki is None
        else ["--grpc-tls-cert", str(pki.server_cert), "--grpc-tls-key", str(pki.server_key)]
    )
    process = SidecarProcess(
        write_rules(workdir), *QUIET_AND_QUICK, *flags, *tls, env=env, transport="fast",
        wrapper=wrapper(setup.nofile, cpus), cwd=tree,
    )  # fmt: skip
    ready(process, pki)
    return Launched(process, Target(process.port, process.proc.pid), dropped)


def ready(process: SidecarProcess, pki: Pki | None) -> None:
    """Until it serves (health SERVING, or a TLS handshake); a process that exits (a flag it
    does not know) fails at once, with its output."""
    address, port = process.address, process.port
    probe = (lambda: serving(address)) if pki is None else (lambda: tls_handshake(port, pki.ca))
    try:
        wait_ready(probe, process.proc, READY_TIMEOUT_S, interval_s=0.1)
    except NotReady as exc:
        process.stop()
        raise AssertionError(f"sidecar did not start ({exc}):\n{process.stderr}") from None


def serving(address: str) -> bool:
    with grpc.insecure_channel(address, options=LOCAL_POOL) as channel:
        try:
            reply = HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=0.5)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def tls_handshake(port: int, ca: Path) -> bool:
    """Whether a TLS handshake with the server on `port` (trusting `ca`) completes."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            context.wrap_socket(sock, server_hostname="127.0.0.1").close()
    except OSError:
        return False
    return True


def wrapper(nofile: int | None, cpus: frozenset[int] | None) -> list[str]:
    """Commands that set the child's descriptor limit (read at its start-up: set before it) and
    its CPUs, then exec it."""
    limit = ["prlimit", f"--nofile={nofile}:{nofile}", "--"] if nofile is not None else []
    return limit + (["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else [])


@functools.cache
def known_flags(tree: Path | None) -> frozenset[str]:
    """The flags `serve --help` lists, of this source tree or of `tree`."""
    env = {**os.environ, **({"PYTHONPATH": str(tree)} if tree else {})}
    done = subprocess.run(
        python_module("ratelimit_sidecar", "serve", "--help"),
        capture_output=True, text=True, timeout=60, check=True, env=env, cwd=tree,
    )  # fmt: skip
    return frozenset(re.findall(r"--[a-z0-9][a-z0-9-]*", done.stdout))


def split_flags(flags: Sequence[str], known: frozenset[str]) -> tuple[list[str], list[str]]:
    """`flags` (name, value pairs) that are `known`, and the names of the others."""
    kept, dropped = [], []
    for name, value in zip(flags[::2], flags[1::2], strict=True):
        if name in known:
            kept += [name, value]
        else:
            dropped.append(name)
    return kept, dropped


# -- every attack, as the bench runs them -------------------------------------------------------


@dataclass(frozen=True)
class Attack:
    name: str
    run: Callable[[Target], Observed]
    setup: Setup = Setup()


ATTACKS: tuple[Attack, ...] = (
    Attack("1 Watch, then 30k HEADERS on its stream", watch_reopened),
    Attack("2 1k streams, 64 SETTINGS x 2,730 windows", settings_flood),
    Attack("3 16x16 uploads of 4 MiB for 8 s", uploads),
    Attack("3 the same, 4 MiB within the bounds", uploads, Setup(WIDE_BOUNDS)),
    Attack("3 a 1 MiB prefix, narrow bounds", huge_prefix, Setup(NARROW_BOUNDS)),
    Attack("4 16 stalled calls, 1 s receive timeout", stalled_streams, Setup(RECEIVE_1S)),
    Attack("5 1,100 idle connections, 1,024 fds", crowd, Setup(nofile=1024)),
    Attack(
        "5 40 idle connections, at most 16",
        functools.partial(crowd, idle=40),
        Setup(CONNECTIONS_16),
    ),
    Attack("5 20 idle connections, 8 per peer", functools.partial(crowd, idle=20), Setup(PEER_8)),
    Attack("6 window to 2^31-1, initial window +1", window_overflow),
    Attack("7 PING instead of SETTINGS", ping_first),
    *(
        Attack(f"8 {name} flood, calls between", functools.partial(interleaved_flood, control=name))
        for name in CONTROL_FRAMES
    ),
    Attack("8 keepalive PINGs, 1/s for 4 s", keepalive),
    Attack("9 4 silent TLS connections", tls_stall, Setup(TLS_1S, tls=True)),
)

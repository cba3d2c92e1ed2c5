"""p99 of honest calls while another connection abuses the fast transport.

h2load paced at PACED_RPS against the pinned sidecar, while one abuser (from
test_transport_abuse.py) loops on the load generators' core, a fresh connection each time: a PING
flood, rapid reset, a CONTINUATION flood, a slow reader. Each row beside a run without. No
target.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.latency import h2load
from bench.load.clients import percentile
from bench.load.cpu import choose_pinning
from bench.load.servers import start_sidecar
from bench.report import Options, Outcome, conclude
from bench.workload import request, rules_dir
from harness.h2raw import RawH2
from ratelimit_sidecar.server.transport import frames as f
from ratelimit_sidecar.server.transport.frames import ErrorCode

NAME = "abuse"
PACED_RPS = 10_000
RUN_S = 4
FLOOD_FRAMES = 20_000
BODY = request("abuser").SerializeToString()


def ping_flood(port: int, stop: threading.Event) -> None:
    _until_closed(port, stop, lambda _raw: f.frame(f.PING, 0, 0, b"12345678") * FLOOD_FRAMES)


def rapid_reset(port: int, stop: threading.Event) -> None:
    def burst(raw: RawH2) -> bytes:
        ids = range(1, 2 * FLOOD_FRAMES, 2)
        return b"".join(raw.headers(i) + f.rst_stream(i, ErrorCode.CANCEL) for i in ids)

    _until_closed(port, stop, burst)


def continuation_flood(port: int, stop: threading.Event) -> None:
    def burst(raw: RawH2) -> bytes:
        opening = f.frame(f.HEADERS, 0, 1, raw.encoder.encode([(":method", "POST")]))
        return opening + f.frame(f.CONTINUATION, 0, 1, b"\0" * 16_000) * 8

    _until_closed(port, stop, burst)


def slow_reader(port: int, stop: threading.Event) -> None:
    raw = RawH2(port)
    burst = b"".join(raw.call(1 + 2 * i, BODY) for i in range(FLOOD_FRAMES))
    sender = threading.Thread(target=raw.send, args=(burst,), daemon=True)
    sender.start()  # blocks once the server stops reading it
    stop.wait()
    raw.close()


def _until_closed(port: int, stop: threading.Event, burst: Callable[[RawH2], bytes]) -> None:
    while not stop.is_set():
        raw = RawH2(port)
        try:
            sender = threading.Thread(target=raw.send, args=(burst(raw),), daemon=True)
            sender.start()
            raw.goaway(timeout_s=10)
        except OSError:
            pass
        finally:
            raw.close()


ABUSERS: dict[str, Callable[[int, threading.Event], None] | None] = {
    "none": None,
    "ping flood": ping_flood,
    "rapid reset": rapid_reset,
    "continuation flood": continuation_flood,
    "slow reader": slow_reader,
}


def run(options: Options) -> Outcome:
    started, pinning = time.monotonic(), choose_pinning()
    pinning.pin_self()  # the abusers run beside h2load, not on the server's core
    print(f"[{NAME}] honest p99 at {PACED_RPS:,} req/s beside one abuser ({pinning.describe()})")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rls-bench-abuse-") as tmp:
        workdir = Path(tmp)
        sidecar = start_sidecar(workdir, pinning, rules_dir(workdir), "--transport", "fast")
        port = int(sidecar.address.rsplit(":", 1)[1])
        try:
            for name, abuser in ABUSERS.items():
                stop = threading.Event()
                thread = None
                if abuser is not None:
                    thread = threading.Thread(target=abuser, args=(port, stop), daemon=True)
                    thread.start()
                    time.sleep(0.5)
                try:
                    rate, lat = h2load(
                        sidecar.address, workdir, pinning, seconds=RUN_S, rps=PACED_RPS
                    )
                finally:
                    stop.set()
                    if thread is not None:
                        thread.join(15)
                rows.append((name, rate, percentile(lat, 50), percentile(lat, 99)))
                print(f"  {name:<20} {rate:9,.0f} req/s  p50 {rows[-1][2]:.2f} ms  "
                      f"p99 {rows[-1][3]:.2f} ms", flush=True)  # fmt: skip
        finally:
            sidecar.stop()
    lines = [f"  {'abuser':<20} {'honest req/s':>13} {'p50 ms':>8} {'p99 ms':>8}"]
    lines += [f"  {n:<20} {r:13,.0f} {p50:8.2f} {p99:8.2f}" for n, r, p50, p99 in rows]
    document = {"paced_rps": PACED_RPS, "rows": rows}
    return conclude(options, NAME, started, lines, document)

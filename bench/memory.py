"""Resident memory per transport: idle, and after 100,000 distinct keys decided once each
(harness/h2raw.py, 200 calls in flight, answers checked; VmRSS after a settle). Then the fast
transport's cost per idle connection (IDLE_CONNECTIONS past the handshake) and per open stream
(OPEN_STREAMS with HEADERS only, on a few connections): RSS growth / N on a fresh sidecar of this
tree and, with BENCH_BEFORE_TREE=/path/to/checkout, of that tree, in interleaved rounds. No target.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from bench.load import runs
from bench.load.runs import Bench
from bench.load.servers import ServerProcess, start_sidecar
from bench.overhead import BEFORE_TREE
from bench.report import Options, Outcome, conclude, fmt, table
from bench.workload import key_values, request
from harness import h2frames as f
from harness.h2raw import RawH2

KEYS = 100_000
IN_FLIGHT = 200
SETTLE_S = 1.0
TRANSPORTS = ("grpcio", "fast")
IDLE_CONNECTIONS = 500
PER_SOURCE = 200  # connections per 127.0.0.x source address: under the per-peer cap (256)
OPEN_STREAMS = 2_000
STREAMS_PER_CONNECTION = 500  # under the advertised 1,024 concurrent streams
COST_ROUNDS = 3  # fresh sidecars per tree and row, trees alternating


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def send_keys(port: int, values: list[str]) -> None:
    """Every value once, IN_FLIGHT calls at a time; raises if one is not answered OK."""
    client = RawH2(port)
    try:
        stream_id = 1
        for start in range(0, len(values), IN_FLIGHT):
            batch = values[start : start + IN_FLIGHT]
            ids = list(range(stream_id, stream_id + 2 * len(batch), 2))
            stream_id = ids[-1] + 2
            bodies = [request(value).SerializeToString() for value in batch]
            client.send(*(client.call(sid, body) for sid, body in zip(ids, bodies, strict=True)))
            for sid, answer in client.responses(ids, timeout_s=30).items():
                if answer.status != 0:
                    raise RuntimeError(f"call {sid}: grpc-status {answer.status} {answer.message}")
    finally:
        client.close()


def measure(transport: str, bench: Bench) -> tuple[int, int]:
    """(idle, with KEYS keys) RSS in KiB of a sidecar on `transport`."""
    flags = ("--max-keys", str(2 * KEYS), "--transport", transport)
    sidecar = start_sidecar(bench, *flags, name=transport)
    try:
        time.sleep(SETTLE_S)
        idle = rss_kib(sidecar.proc.pid)
        send_keys(int(sidecar.address.rsplit(":", 1)[1]), key_values(KEYS))
        time.sleep(SETTLE_S)
        return idle, rss_kib(sidecar.proc.pid)
    finally:
        sidecar.stop()


def handshaken(port: int, count: int, held: list[socket.socket]) -> None:
    """`count` connections into `held`, PER_SOURCE from each of 127.0.0.2, .3, ..., each past
    the handshake: our preface, SETTINGS and ACK sent, the server's SETTINGS and its ACK read."""
    for i in range(count):
        source = (f"127.0.0.{2 + i // PER_SOURCE}", 0)
        held.append(socket.create_connection(("127.0.0.1", port), 10, source_address=source))
        held[-1].sendall(f.PREFACE + f.settings({}) + f.settings_ack())
    for sock in held:
        pending, acked = b"", False
        while not acked:
            if not (chunk := sock.recv(65536)):
                raise ConnectionError("the server closed a connection in its handshake")
            pending += chunk
            while len(pending) >= 9:
                high, low, kind, flags, _ = f.FRAME_HEADER.unpack_from(pending)
                if len(pending) < (end := 9 + (high << 16 | low)):
                    break
                acked |= kind == f.SETTINGS and bool(flags & f.ACK)
                pending = pending[end:]


def open_streams(port: int, count: int, held: list[RawH2]) -> None:
    """`count` streams opened by HEADERS alone, STREAMS_PER_CONNECTION on each connection."""
    for start in range(0, count, STREAMS_PER_CONNECTION):
        held.append(raw := RawH2(port))
        raw.advertised()
        ids = range(1, 2 * min(STREAMS_PER_CONNECTION, count - start), 2)
        raw.send(*(raw.headers(stream_id) for stream_id in ids))


def still_open(held: list[RawH2]) -> None:
    """Raises if the server reset a stream or closed a connection (frames read until quiet)."""
    for raw in held:
        while True:
            try:
                frame = raw.read_frame(timeout_s=0.2)
            except TimeoutError:
                break
            if frame is None or frame.kind in (f.RST_STREAM, f.GOAWAY):
                raise RuntimeError(f"streams not held open: {frame}")


def per_item(sidecar: ServerProcess, count: int, streams: bool) -> float:
    """Bytes of RSS per idle connection (with `streams`: per open stream) on `sidecar`, from
    after one call's warm-up to a settle after opening them."""
    port = int(sidecar.address.rsplit(":", 1)[1])
    send_keys(port, ["warm-up"])
    time.sleep(SETTLE_S)
    before = rss_kib(sidecar.proc.pid)
    clients: list[RawH2] = []
    sockets: list[socket.socket] = []
    try:
        if streams:
            open_streams(port, count, clients)
        else:
            handshaken(port, count, sockets)
        time.sleep(SETTLE_S)
        after = rss_kib(sidecar.proc.pid)
        still_open(clients)  # within the unary receive timeout (10 s)
    finally:
        for raw in clients:
            raw.close()
        for sock in sockets:
            sock.close()
    return (after - before) * 1024 / count


def costs(bench: Bench, trees: dict[str, str | None]) -> dict[str, dict[str, list[float]]]:
    """Per tree, bytes per idle connection and per open stream of each of COST_ROUNDS, each
    measured on a fresh sidecar, the trees alternating."""
    found: dict[str, dict[str, list[float]]] = {t: {"idle": [], "stream": []} for t in trees}
    for round_no in range(COST_ROUNDS):
        order = list(trees.items()) if round_no % 2 == 0 else list(trees.items())[::-1]
        for name, tree in order:
            env = {"PYTHONPATH": tree} if tree else None
            for kind, count in (("idle", IDLE_CONNECTIONS), ("stream", OPEN_STREAMS)):
                sidecar = start_sidecar(bench, "--transport", "fast", name=name, env=env)
                try:
                    found[name][kind].append(per_item(sidecar, count, kind == "stream"))
                finally:
                    sidecar.stop()
            print(f"  round {round_no + 1} {name}: "
                  f"{found[name]['idle'][-1]:,.0f} B per idle connection, "
                  f"{found[name]['stream'][-1]:,.0f} B per open stream", flush=True)  # fmt: skip
    return found


def cost_table(found: dict[str, dict[str, list[float]]]) -> str:
    """The two rows: median bytes per item of each tree, its range over rounds in brackets."""
    shown: Callable[[list[float]], str] = lambda v: (  # noqa: E731
        f"{fmt(statistics.median(v))} ({fmt(min(v))}..{fmt(max(v))})"
    )
    rows = [
        [label, f"{count:,}", *(shown(found[tree][kind]) for tree in found)]
        for label, kind, count in (
            ("per idle connection", "idle", IDLE_CONNECTIONS),
            ("per open stream", "stream", OPEN_STREAMS),
        )
    ]
    return table(("fast transport", "N", *(f"{tree} B" for tree in found)), rows, left=2)


def run(options: Options) -> Outcome:
    trees: dict[str, str | None] = {"this": None}
    if before := os.environ.get(BEFORE_TREE):
        trees["before"] = str(Path(before).resolve())
    with runs.session(options, 0.0, 1) as bench:
        rows = {transport: measure(transport, bench) for transport in TRANSPORTS}
        found = costs(bench, trees)
    cells = [
        [t, fmt(idle / 1024, 1), fmt(full / 1024, 1), fmt((full - idle) * 1024 / KEYS)]
        for t, (idle, full) in rows.items()
    ]
    lines = [table(("transport", "idle MiB", "100k keys MiB", "per key B"), cells, left=1)]
    lines += ["", cost_table(found), f"B = RSS growth / N: median of {COST_ROUNDS} rounds (range)"]
    document = {
        "keys": KEYS, "rss_kib": {t: {"idle": i, "keys": k} for t, (i, k) in rows.items()},
        "per_item_bytes": found, "idle_connections": IDLE_CONNECTIONS, "open_streams": OPEN_STREAMS,
    }  # fmt: skip
    return conclude(options, lines, document)

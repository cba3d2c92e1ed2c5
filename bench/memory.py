"""Resident memory per transport: idle, and after 100,000 distinct keys decided once each
(harness/h2raw.py, 200 calls in flight, answers checked; VmRSS after a settle). No target.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.load import runs
from bench.load.runs import Bench
from bench.load.servers import start_sidecar
from bench.report import Options, Outcome, conclude, fmt, table
from bench.workload import key_values, request
from harness.h2raw import RawH2

KEYS = 100_000
IN_FLIGHT = 200
SETTLE_S = 1.0
TRANSPORTS = ("grpcio", "fast")


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


def run(options: Options) -> Outcome:
    with runs.session(options, 0.0, 1) as bench:
        rows = {transport: measure(transport, bench) for transport in TRANSPORTS}
    cells = [
        [t, fmt(idle / 1024, 1), fmt(full / 1024, 1), fmt((full - idle) * 1024 / KEYS)]
        for t, (idle, full) in rows.items()
    ]
    lines = [table(("transport", "idle MiB", "100k keys MiB", "per key B"), cells, left=1)]
    document = {"keys": KEYS, "rss_kib": {t: {"idle": i, "keys": k} for t, (i, k) in rows.items()}}
    return conclude(options, lines, document)

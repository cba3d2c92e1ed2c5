"""p99 of a decision at half the saturation rate, per transport: the sidecar on one pinned
core, h2load on the other (8 connections × 16 streams, one hot key).

For each transport and round: a run at full speed gives the saturation rate, then a run paced
at half of it (h2load --rps per connection) gives the latency percentiles, from h2load's
per-request log. A third run paces grpcio's half rate on the fast transport: the same traffic
as today's half load. Rounds alternate the transports; the table shows each value's range.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from pathlib import Path

from bench.load.clients import percentile
from bench.load.cpu import Pinning, choose_pinning
from bench.load.servers import start_sidecar
from bench.report import Options, Outcome, conclude
from bench.workload import hot_10, rules_dir
from ratelimit_sidecar._proto import wire

NAME = "latency"
CONNECTIONS, STREAMS = 8, 16
ROUNDS = 3
FULL_S, PACED_S = 3, 4
TRANSPORTS = ("grpcio", "fast")
_RPS = re.compile(r"finished in [\d.]+m?s, ([\d.]+) req/s")


def h2load(
    address: str, body: Path, log: Path, pinning: Pinning, *, seconds: int, rps: int = 0
) -> tuple[float, list[float]]:
    """(requests per second, sorted latencies in ms) of one h2load run."""
    argv = ["h2load", "-t", "1", "-c", str(CONNECTIONS), "-m", str(STREAMS), "-D", str(seconds)]
    if rps:
        argv += ["--rps", str(max(1, rps // CONNECTIONS))]
    argv += ["-d", str(body), "--log-file", str(log)]
    argv += ["-H", "content-type: application/grpc", "-H", "te: trailers"]
    argv.append(f"http://{address}{wire.METHOD_PATH}")
    log.unlink(missing_ok=True)
    out = subprocess.run(
        pinning.taskset(argv, pinning.client_cpus), capture_output=True, text=True, check=True,
        timeout=seconds + 30,
    ).stdout  # fmt: skip
    found = _RPS.search(out)
    if found is None:
        raise RuntimeError(f"h2load printed no rate:\n{out}")
    fields = (line.split("\t") for line in log.read_text().splitlines())
    latencies = sorted(int(f[2]) / 1000 for f in fields if len(f) > 2 and f[1].startswith("2"))
    return float(found.group(1)), latencies


def run(options: Options) -> Outcome:
    started, rounds = time.monotonic(), options.rounds or ROUNDS
    pinning = choose_pinning()
    print(f"[{NAME}] p99 at half the saturation rate, per transport ({pinning.describe()})")
    rows: dict[str, list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="rls-bench-latency-") as tmp:
        workdir = Path(tmp)
        body = workdir / "body.bin"
        body.write_bytes(hot_10().frames[0])  # the bench rule's request (bench/workload.py)
        rules, log = rules_dir(workdir), workdir / "h2load.log"
        half_grpcio = 0.0
        for round_no in range(rounds):
            for transport in TRANSPORTS if round_no % 2 == 0 else TRANSPORTS[::-1]:
                sidecar = start_sidecar(
                    workdir, pinning, rules, "--transport", transport, name=f"sidecar-{transport}"
                )
                try:
                    full, _lat = h2load(sidecar.address, body, log, pinning, seconds=FULL_S)
                    rate, lat = h2load(
                        sidecar.address, body, log, pinning, seconds=PACED_S, rps=int(full / 2)
                    )
                    rows.setdefault(transport, []).append((full, rate, percentile(lat, 99)))
                    print(f"  round {round_no + 1} {transport:<7} full {full:9,.0f} req/s; "
                          f"at {rate:9,.0f} req/s p50 {percentile(lat, 50):.2f} ms "
                          f"p99 {percentile(lat, 99):.2f} ms", flush=True)  # fmt: skip
                    if transport == "grpcio":
                        half_grpcio = full / 2
                    elif half_grpcio:
                        same, lat = h2load(
                            sidecar.address, body, log, pinning, seconds=PACED_S,
                            rps=int(half_grpcio),
                        )  # fmt: skip
                        rows.setdefault("fast at grpcio's half", []).append(
                            (full, same, percentile(lat, 99))
                        )
                finally:
                    sidecar.stop()
    lines = [f"  {'transport':<22} {'saturation req/s':>20} {'paced req/s':>18} {'p99 ms':>14}"]
    for name, values in rows.items():
        cols = [_span([v[i] for v in values], ",.0f" if i < 2 else ".2f") for i in range(3)]
        lines.append(f"  {name:<22} {cols[0]:>20} {cols[1]:>18} {cols[2]:>14}")
    document = {"rows": rows, "connections": CONNECTIONS, "streams": STREAMS}
    return conclude(options, NAME, started, lines, document)


def _span(values: list[float], spec: str) -> str:
    low, high = min(values), max(values)
    return f"{low:{spec}}" if low == high else f"{low:{spec}}–{high:{spec}}"

"""p99 of a decision at half the saturation rate, per transport (sidecar pinned, h2load on the
other core).

Per transport and round: a full-speed run gives the saturation rate, a run paced at half of it
the percentiles; a third paces grpcio's half rate on the fast transport. Rounds alternate the
transports; the table shows each value's range.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.load.clients import H2load, LoadShape, percentile
from bench.load.cpu import Pinning, choose_pinning
from bench.load.servers import start_sidecar
from bench.report import Options, Outcome, conclude
from bench.workload import Workload, hot_10, rules_dir

NAME = "latency"
CONNECTIONS, STREAMS = 8, 16
ROUNDS = 3
FULL_S, PACED_S = 3, 4
TRANSPORTS = ("grpcio", "fast")


def h2load(
    address: str, workdir: Path, pinning: Pinning, *, seconds: int, rps: int = 0
) -> tuple[float, list[float]]:
    """(requests per second, sorted latencies in ms) of one h2load run of one hot-10 body."""
    shape = LoadShape(CONNECTIONS, STREAMS, 0.0, seconds, rps)
    prefix = pinning.taskset([], pinning.client_cpus)
    load = H2load().start(address, Workload("hot-1", hot_10().frames[:1]), shape, workdir, prefix)
    raw = load.finish(seconds + 30)
    if not raw.requests:
        raise RuntimeError(f"h2load answered nothing: {raw.first_error}")
    return raw.requests / seconds, sorted(raw.latencies_ms)


def run(options: Options) -> Outcome:
    started, rounds = time.monotonic(), options.rounds or ROUNDS
    pinning = choose_pinning()
    print(f"[{NAME}] p99 at half the saturation rate, per transport ({pinning.describe()})")
    rows: dict[str, list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="rls-bench-latency-") as tmp:
        workdir = Path(tmp)
        rules = rules_dir(workdir)
        half_grpcio = 0.0
        for round_no in range(rounds):
            for transport in TRANSPORTS if round_no % 2 == 0 else TRANSPORTS[::-1]:
                sidecar = start_sidecar(
                    workdir, pinning, rules, "--transport", transport, name=f"sidecar-{transport}"
                )
                try:
                    full, _lat = h2load(sidecar.address, workdir, pinning, seconds=FULL_S)
                    rate, lat = h2load(
                        sidecar.address, workdir, pinning, seconds=PACED_S, rps=int(full / 2)
                    )
                    rows.setdefault(transport, []).append((full, rate, percentile(lat, 99)))
                    print(f"  round {round_no + 1} {transport:<7} full {full:9,.0f} req/s; "
                          f"at {rate:9,.0f} req/s p50 {percentile(lat, 50):.2f} ms "
                          f"p99 {percentile(lat, 99):.2f} ms", flush=True)  # fmt: skip
                    if transport == "grpcio":
                        half_grpcio = full / 2
                    elif half_grpcio:
                        same, lat = h2load(
                            sidecar.address, workdir, pinning, seconds=PACED_S,
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

"""p99 of a decision at half the saturation rate, per transport (sidecar pinned, h2load on the
other core). Per transport and round: a full-speed run gives the saturation rate, a run paced at
half of it the percentiles; a third paces grpcio's half rate on the fast transport. Rounds
alternate the transports; the table shows each value's range.
"""

from __future__ import annotations

from functools import partial

from bench.load import runs
from bench.load.clients import H2load, LoadShape, percentile
from bench.load.runs import Bench
from bench.load.servers import start_sidecar
from bench.report import Options, Outcome, conclude, table
from bench.workload import Workload, hot_10

CONNECTIONS, STREAMS = 8, 16
ROUNDS = 3
FULL_S, PACED_S = 3, 4
TRANSPORTS = ("grpcio", "fast")


def h2load(address: str, bench: Bench, *, seconds: int, rps: int = 0) -> tuple[float, list[float]]:
    """(requests per second, sorted latencies in ms) of one h2load run of one hot-10 body."""
    shape = LoadShape(CONNECTIONS, STREAMS, 0.0, seconds, rps)
    prefix, hot_1 = bench.pinning.taskset([], bench.pinning.client_cpus), hot_10().frames[:1]
    load = H2load().start(address, Workload("hot-1", hot_1), shape, bench.workdir, prefix)
    raw = load.finish(seconds + 30)
    if not raw.requests:
        raise RuntimeError(f"h2load answered nothing: {raw.first_error}")
    return raw.requests / seconds, sorted(raw.latencies_ms)


def run(options: Options) -> Outcome:
    rows: dict[str, list[tuple[float, float, float]]] = {}
    half_grpcio = 0.0
    with runs.session(options, 0.0, ROUNDS) as bench:
        print(f"  pinning: {bench.pinning.describe()}")
        for round_no in range(bench.rounds):
            for transport in TRANSPORTS if round_no % 2 == 0 else TRANSPORTS[::-1]:
                sidecar = start_sidecar(bench, "--transport", transport, name=transport)
                load = partial(h2load, sidecar.address, bench)
                try:
                    full, _ = load(seconds=FULL_S)
                    paced = {transport: full / 2}
                    if transport == "grpcio":
                        half_grpcio = full / 2
                    elif half_grpcio:
                        paced["fast at grpcio's half"] = half_grpcio
                    for name, rps in paced.items():
                        rate, lat = load(seconds=PACED_S, rps=int(rps))
                        rows.setdefault(name, []).append((full, rate, percentile(lat, 99)))
                        p99 = rows[name][-1][2]
                        cells = f"full {full:,.0f}, paced {rate:,.0f} req/s, p99 {p99:.2f} ms"
                        print(f"  round {round_no + 1} {name}: {cells}", flush=True)
                finally:
                    sidecar.stop()
    header = ("transport", "saturation req/s", "paced req/s", "p99 ms")
    body = [
        [name, *(span([v[i] for v in values], ",.0f" if i < 2 else ".2f") for i in range(3))]
        for name, values in rows.items()
    ]
    document = {"rows": rows, "connections": CONNECTIONS, "streams": STREAMS}
    return conclude(options, [table(header, body, left=1)], document)


def span(values: list[float], spec: str) -> str:
    low, high = min(values), max(values)
    return f"{low:{spec}}" if low == high else f"{low:{spec}}–{high:{spec}}"

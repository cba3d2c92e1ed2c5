"""p99 of honest calls while another connection abuses the fast transport: h2load paced at
PACED_RPS against the pinned sidecar, beside one abuser (from test_transport_abuse.py) looping on
the load generators' core on fresh connections: a PING flood, rapid reset, a CONTINUATION flood,
a slow reader; and a run without.

Then each attack of the bounded-transport issue (harness/attacks.py, as its tests run them), on a
fresh pinned sidecar of this tree and, with BENCH_BEFORE_TREE=/path/to/checkout, of that tree in
the same run: the process's RSS growth, other clients' p50/p99 on a connection of their own
meanwhile, and the outcome (GOAWAY code, how the streams ended). A flag a tree does not know is
left out and named. No target.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from bench.latency import h2load
from bench.load import runs
from bench.load.clients import percentile
from bench.load.runs import Bench
from bench.load.servers import start_sidecar
from bench.overhead import BEFORE_TREE
from bench.report import Options, Outcome, conclude, fmt, table
from bench.workload import request
from harness import h2frames as f
from harness.attacks import ATTACKS, Attack, launch
from harness.h2raw import RawH2
from ratelimit_sidecar.grpc_server.protocol.frames import ErrorCode

PACED_RPS = 10_000
RUN_S = 4
FLOOD_FRAMES = 20_000
BODY = request("abuser").SerializeToString()


def ping_flood(_raw: RawH2) -> bytes:
    return f.frame(f.PING, 0, 0, b"12345678") * FLOOD_FRAMES


def rapid_reset(raw: RawH2) -> bytes:
    ids = range(1, 2 * FLOOD_FRAMES, 2)
    return b"".join(raw.headers(i) + f.rst_stream(i, ErrorCode.CANCEL) for i in ids)


def continuation_flood(raw: RawH2) -> bytes:
    opening = f.frame(f.HEADERS, 0, 1, raw.encoder.encode([(":method", "POST")]))
    return opening + f.frame(f.CONTINUATION, 0, 1, b"\0" * 16_000) * 8


def slow_reader(port: int, stop: threading.Event) -> None:
    raw = RawH2(port)
    burst = b"".join(raw.call(1 + 2 * i, BODY) for i in range(FLOOD_FRAMES))
    sender = threading.Thread(target=raw.send, args=(burst,), daemon=True)
    sender.start()  # blocks once the server stops reading it
    stop.wait()
    raw.close()


def until_closed(burst: Callable[[RawH2], bytes], port: int, stop: threading.Event) -> None:
    """`burst` on a fresh connection, again each time the server closes it, until `stop`."""
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


Abuser = Callable[[int, threading.Event], None]
ABUSERS: dict[str, Abuser] = {
    "ping flood": partial(until_closed, ping_flood),
    "rapid reset": partial(until_closed, rapid_reset),
    "continuation flood": partial(until_closed, continuation_flood),
    "slow reader": slow_reader,
}


def beside(abuser: Abuser | None, address: str, bench: Bench) -> tuple[float, list[float]]:
    """h2load's rate and latencies with `abuser` (if any) looping on its own connections."""
    stop, port = threading.Event(), int(address.rsplit(":", 1)[1])
    thread = threading.Thread(target=abuser or stop.wait, args=(port, stop) if abuser else ())
    thread.start()
    time.sleep(0.5 if abuser else 0.0)
    try:
        return h2load(address, bench, seconds=RUN_S, rps=PACED_RPS)
    finally:
        stop.set()
        thread.join(15)


def run(options: Options) -> Outcome:
    rows = []
    with runs.session(options, 0.0, 1) as bench:  # the abusers run beside h2load
        print(f"  at {PACED_RPS:,} req/s; pinning: {bench.pinning.describe()}")
        sidecar = start_sidecar(bench, "--transport", "fast")
        try:
            for name, abuser in {"none": None, **ABUSERS}.items():
                rate, lat = beside(abuser, sidecar.address, bench)
                p50, p99 = percentile(lat, 50), percentile(lat, 99)
                rows.append((name, rate, p50, p99))
                print(f"  {name}: {rate:,.0f} req/s, p50 {p50:.2f}, p99 {p99:.2f} ms")
        finally:
            sidecar.stop()
        attacked = attack_rows(bench, trees())
    cells = [[n, fmt(r), fmt(p50, 2), fmt(p99, 2)] for n, r, p50, p99 in rows]
    lines = [table(("abuser", "honest req/s", "p50 ms", "p99 ms"), cells, left=1), "", *attacked]
    return conclude(options, lines, {"paced_rps": PACED_RPS, "rows": rows, "attacks": attacked})


def trees() -> dict[str, Path | None]:
    """This tree, and BENCH_BEFORE_TREE's (as `before`) when set."""
    found: dict[str, Path | None] = {"this": None}
    if before := os.environ.get(BEFORE_TREE):
        found["before"] = Path(before).resolve()
    return found


ATTACK_HEADER = ("attack", "tree", "RSS +MB", "others p50 ms", "others p99 ms", "failed")


def attack_rows(bench: Bench, sources: dict[str, Path | None]) -> list[str]:
    """Each attack on each tree's sidecar, tree after tree: a table with the outcome last."""
    rows: list[tuple[list[str], str]] = []
    for index, attack in enumerate(ATTACKS):
        for name, tree in sources.items():
            rows.append(attack_row(bench, attack, name, tree, bench.workdir / f"attack-{index}"))
            print(f"  {attack.name} [{name}]: {rows[-1][1]}", flush=True)
    return with_outcomes(table(ATTACK_HEADER, [cells for cells, _ in rows], left=2), rows)


def attack_row(
    bench: Bench, attack: Attack, name: str, tree: Path | None, workdir: Path
) -> tuple[list[str], str]:
    """One attack on a fresh sidecar of `tree` on the servers' CPUs: its cells and outcome."""
    cpus = bench.pinning.server_cpus if bench.pinning.pinned else None
    try:
        launched = launch(attack.setup, workdir / name, tree=tree, cpus=cpus, drop_unknown=True)
    except AssertionError as exc:  # a tree whose sidecar does not start: said, not fatal
        return [attack.name, name, "-", "-", "-", "-"], f"did not start: {exc}"[:200]
    try:
        found = attack.run(launched.target)
    finally:
        launched.stop()
    without = f"; without {', '.join(launched.dropped)} (unknown)" if launched.dropped else ""
    failed = str(len(found.others_failed)) if found.others_ms else "-"
    numbers = [fmt(found.rss_growth_mb, 1), fmt(found.others(50), 2), fmt(found.others(99), 2)]
    return [attack.name, name, *numbers, failed], found.outcome() + without


def with_outcomes(rendered: str, rows: Sequence[tuple[list[str], str]]) -> list[str]:
    """The table's lines with each row's outcome appended (text too long for a column)."""
    header, rule, *body = rendered.split("\n")
    outcomes = [outcome for _, outcome in rows]
    return [
        f"{header}  outcome",
        rule,
        *(f"{line}  {o}" for line, o in zip(body, outcomes, strict=True)),
    ]

"""Rules from xDS (issue #27): how fast a push reaches a fleet, and how often a sidecar knocks
while its control plane is down.

- propagation: three sidecars on one ADS server; `PUSHES` pushes, each timed until every node
  answers the new limit (polled: an upper bound). Target: p99 under 1 s.
- reconnects: one sidecar with the default backoff (3 s doubling to 60 s, jittered); the control
  plane stopped, `xds_connect_attempts_total` read every minute for `DOWN_S` (`--duration`).
  Target: at most `MAX_FIRST_MINUTE` attempts in the first minute and `MAX_LATER_MINUTE` after,
  answering from its last rules all along.
"""

from __future__ import annotations

import itertools
import statistics
import time

import grpc

from bench.report import Options, Outcome, conclude, fmt, table
from harness.grpc_client import request, rls_stub
from harness.process import wait_ready
from harness.sidecar import SidecarProcess
from harness.xds_server import GATEWAY_DOMAIN, GATEWAY_PREFIX, AdsServer, gateway_config

PUSHES = 30
NODES = 3
DOWN_S = 180.0
MAX_FIRST_MINUTE = 7  # 1 + delays of at least 1.5, 3, 6, 12, 24 s
MAX_LATER_MINUTE = 3  # delays of at least 30 s
TARGET_P99_S = 1.0


def limit_seen(node: SidecarProcess, client: int) -> int:
    message = request(GATEWAY_DOMAIN, [*GATEWAY_PREFIX, ("remote_address", f"10.9.0.{client}")])
    with grpc.insecure_channel(node.address) as channel:
        reply = rls_stub(channel).ShouldRateLimit(message, timeout=5)
    return int(reply.statuses[0].current_limit.requests_per_unit)


def propagation(ads: AdsServer, nodes: list[SidecarProcess]) -> list[float]:
    seconds = []
    for push in range(PUSHES):
        limit = 100 + push
        started = time.monotonic()
        ads.push([gateway_config(limit)], f"p{push}")
        while not all(limit_seen(node, push % 250) == limit for node in nodes):
            if time.monotonic() - started > 10:
                raise RuntimeError(f"push {push} not seen within 10 s")
            time.sleep(0.005)
        seconds.append(time.monotonic() - started)
    return seconds


def reconnects(ads: AdsServer, node: SidecarProcess, down_s: float) -> tuple[list[float], bool]:
    """Attempts per minute (the last one partial) while the control plane is down; whether the
    node answered its last limit at every check."""
    ads.push([gateway_config(42)], "before-down")
    wait_ready(lambda: limit_seen(node, 1) == 42, None, 10)
    ads.stop()
    counts, answered, started = [node.metric("xds_connect_attempts_total")], True, time.monotonic()
    while (elapsed := time.monotonic() - started) < down_s:
        time.sleep(min(60.0, down_s - elapsed, 60.0 - elapsed % 60.0))
        answered = answered and limit_seen(node, 2) == 42
        counts.append(node.metric("xds_connect_attempts_total"))
    return [b - a for a, b in itertools.pairwise(counts)], answered


def run(options: Options) -> Outcome:
    down_s = options.duration_s or DOWN_S
    ads = AdsServer().start()
    nodes: list[SidecarProcess] = []
    try:
        for index in range(NODES):
            flags = ("--config-xds", ads.address, "--node-id", f"xds-bench-{index}")
            nodes.append(SidecarProcess(None, *flags).wait_ready())
        pushed = propagation(ads, nodes)
        per_minute, answered = reconnects(ads, nodes[0], down_s)
    finally:
        for node in nodes:
            node.stop()
        ads.stop()
    p50 = statistics.median(pushed)
    p99 = statistics.quantiles(pushed, n=100, method="inclusive")[98]
    bounded = bool(per_minute) and per_minute[0] <= MAX_FIRST_MINUTE and answered
    bounded = bounded and all(n <= MAX_LATER_MINUTE for n in per_minute[1:])
    rows = [
        ["push -> every node, p50 (ms)", fmt(p50 * 1000, 1), ""],
        ["push -> every node, p99 (ms)", fmt(p99 * 1000, 1), f"< {TARGET_P99_S * 1000:g}"],
        ["push -> every node, max (ms)", fmt(max(pushed) * 1000, 1), ""],
        ["reconnect attempts per minute while down", " ".join(fmt(n) for n in per_minute),
         f"<= {MAX_FIRST_MINUTE}, then <= {MAX_LATER_MINUTE}"],
        ["answered its last rules while down", str(answered), "True"],
    ]  # fmt: skip
    lines = [
        f"{PUSHES} pushes to {NODES} sidecars; then the control plane down {down_s:g} s",
        table(["measure", "value", "target"], rows, left=1),
    ]
    document = {"push_seconds": pushed, "push_p50_s": p50, "push_p99_s": p99, "down_s": down_s,
                "reconnect_attempts_per_minute": per_minute,
                "answered_while_down": answered}  # fmt: skip
    return conclude(options, lines, document, [p99 < TARGET_P99_S, bounded])

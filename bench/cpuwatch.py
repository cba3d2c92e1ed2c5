"""CPU accounting from /proc for load runs: who used the server's and the client's CPU.

A snapshot holds the server's, the load generator's and this process's CPU time and the busy
ticks of the pinned CPUs; two snapshots make a window. Busy time on a pinned CPU beyond our own
processes is interference: other processes on a shared machine, or steal by the hypervisor.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bench import cpu

NOISE_LIMIT_PCT = 10.0  # other work on the server CPU above this makes a run "noisy"
QUIET_LIMIT_PCT = 10.0
QUIET_WAIT_S = 0.5


@dataclass(frozen=True, slots=True)
class CpuWindow:
    """CPU use in % of one core over the sampled part of the measurement window."""

    wall_s: float
    server_pct: float
    client_pct: float
    other_on_server_cpu_pct: float | None  # None when not pinned: cannot be attributed
    other_on_client_cpu_pct: float | None

    @property
    def noisy(self) -> bool:
        other = self.other_on_server_cpu_pct
        return other is not None and other > NOISE_LIMIT_PCT


@dataclass(frozen=True, slots=True)
class Snapshot:
    at: float
    server_s: float
    client_s: float
    self_s: float
    busy: dict[int, int]


def snapshot(server_pid: int, client_pids: list[int], pinning: cpu.Pinning) -> Snapshot:
    cpus = [c for c in (pinning.server_cpu, pinning.client_cpu) if c is not None]
    return Snapshot(
        time.monotonic(),
        cpu.cpu_seconds(server_pid),
        cpu.total_cpu_seconds(client_pids),
        cpu.cpu_seconds(os.getpid()),
        cpu.cpu_busy_ticks(cpus),
    )


def window(a: Snapshot, b: Snapshot, pinning: cpu.Pinning) -> CpuWindow:
    wall = max(b.at - a.at, 1e-9)

    def pct(before: float, after: float) -> float:
        return 100.0 * (after - before) / wall

    def busy(core: int) -> float:
        return pct(a.busy[core], b.busy[core]) / cpu.CLOCK_TICKS

    server = pct(a.server_s, b.server_s)
    client = pct(a.client_s, b.client_s)
    if pinning.server_cpu is None or pinning.client_cpu is None:
        return CpuWindow(wall, server, client, None, None)
    own_on_client_cpu = client + pct(a.self_s, b.self_s)
    return CpuWindow(
        wall,
        server,
        client,
        max(0.0, busy(pinning.server_cpu) - server),
        max(0.0, busy(pinning.client_cpu) - own_on_client_cpu),
    )


def _foreign_pct(cpus: list[int], own_pids: list[int], seconds: float) -> float:
    """CPU % taken on `cpus` by anything but `own_pids` over the next `seconds`."""
    busy_before, own_before = cpu.cpu_busy_ticks(cpus), cpu.total_cpu_seconds(own_pids)
    start = time.monotonic()
    time.sleep(seconds)
    busy_after, own_after = cpu.cpu_busy_ticks(cpus), cpu.total_cpu_seconds(own_pids)
    wall = time.monotonic() - start
    busy = sum(busy_after[c] - busy_before[c] for c in cpus) / cpu.CLOCK_TICKS
    return 100.0 * (busy - (own_after - own_before)) / wall


def wait_for_quiet(
    pinning: cpu.Pinning, own_pids: list[int], limit_s: float = QUIET_WAIT_S
) -> bool:
    """Wait (up to `limit_s`) for half a second without foreign work on our CPUs; True if found."""
    cpus = [c for c in (pinning.server_cpu, pinning.client_cpu) if c is not None]
    if not cpus:
        return True
    deadline = time.monotonic() + limit_s
    while _foreign_pct(cpus, own_pids, 0.5) >= QUIET_LIMIT_PCT:
        if time.monotonic() > deadline:
            return False
    return True


def pooled_cpu(windows: Sequence[CpuWindow]) -> CpuWindow:
    """Wall-time weighted averages of several windows."""
    wall = sum(w.wall_s for w in windows)
    others = [w.other_on_server_cpu_pct for w in windows]

    def mean(values: Sequence[float]) -> float:
        return sum(v * w.wall_s for v, w in zip(values, windows, strict=True)) / wall

    client_others = [w.other_on_client_cpu_pct for w in windows]
    return CpuWindow(
        wall,
        mean([w.server_pct for w in windows]),
        mean([w.client_pct for w in windows]),
        None if None in others else mean([o or 0.0 for o in others]),
        None if None in client_others else mean([o or 0.0 for o in client_others]),
    )

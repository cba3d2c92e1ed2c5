"""CPU pinning, and who used which CPU during a load run (from /proc).

Servers get one CPU, the load generators and this process another. Busy time beyond our own
processes is interference; over NOISE_LIMIT_PCT on the server CPU a run is "noisy". Unpinned,
every process shares every CPU.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
NOISE_LIMIT_PCT = 10.0
QUIET_LIMIT_PCT = 10.0
QUIET_WAIT_S = 0.5


@dataclass(frozen=True, slots=True)
class Pinning:
    server_cpus: frozenset[int]
    client_cpus: frozenset[int]

    @property
    def pinned(self) -> bool:
        return not self.server_cpus & self.client_cpus

    def describe(self) -> str:
        if not self.pinned:
            return f"none: servers, load generators and driver share CPUs {_list(self.server_cpus)}"
        return (
            f"servers on CPU {_list(self.server_cpus)}, load generators and this driver on CPU "
            f"{_list(self.client_cpus)}"
        )

    def taskset(self, argv: Sequence[str], cpus: frozenset[int]) -> list[str]:
        """`argv` under `taskset` (affinity set before exec: every thread has it) when pinned."""
        return ["taskset", "-c", _list(cpus), *argv] if self.pinned else list(argv)

    def pin_self(self) -> None:
        os.sched_setaffinity(0, self.client_cpus)


def _list(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def choose_pinning(pin: bool = True) -> Pinning:
    """Servers on the first usable CPU, everything else on the second; unpinned if impossible."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return Pinning(frozenset(cpus), frozenset(cpus))
    return Pinning(frozenset(cpus[:1]), frozenset(cpus[1:2]))


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU time of the processes (all their threads); 0 for one that is gone."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    return total


def busy_ticks(cpus: Iterable[int]) -> int:
    """Clock ticks the CPUs spent on anything but idle and iowait, from /proc/stat."""
    wanted = {f"cpu{cpu}" for cpu in cpus}
    busy = 0
    with open("/proc/stat", encoding="ascii") as stat:
        for line in stat:
            name, *values = line.split()
            if name in wanted:
                ticks = [int(v) for v in values[:8]]  # up to steal
                busy += sum(ticks) - ticks[3] - ticks[4]
    return busy


@dataclass(frozen=True, slots=True)
class CpuWindow:
    """CPU use in % of one core over the sampled part of a run."""

    wall_s: float
    roles: dict[str, float]  # each group of server processes, e.g. {"envoy": .., "service": ..}
    client_pct: float
    other_on_server_cpu_pct: float  # unpinned: other work anywhere on the machine
    other_on_client_cpu_pct: float | None  # None when unpinned

    @property
    def server_pct(self) -> float:
        return sum(self.roles.values())

    @property
    def noisy(self) -> bool:
        return self.other_on_server_cpu_pct > NOISE_LIMIT_PCT


@dataclass(frozen=True, slots=True)
class Snapshot:
    at: float
    roles: dict[str, float]
    client_s: float
    self_s: float
    server_busy: int
    client_busy: int


def snapshot(pinning: Pinning, roles: Mapping[str, list[int]], clients: list[int]) -> Snapshot:
    return Snapshot(
        time.monotonic(), {role: cpu_seconds(pids) for role, pids in roles.items()},
        cpu_seconds(clients), cpu_seconds([os.getpid()]),
        busy_ticks(pinning.server_cpus), busy_ticks(pinning.client_cpus),
    )  # fmt: skip


def window(a: Snapshot, b: Snapshot, pinning: Pinning) -> CpuWindow:
    wall = max(b.at - a.at, 1e-9)

    def pct(before: float, after: float) -> float:
        return 100.0 * (after - before) / wall

    roles = {role: pct(a.roles[role], b.roles[role]) for role in a.roles}
    server, client, own = sum(roles.values()), pct(a.client_s, b.client_s), pct(a.self_s, b.self_s)
    server_busy = pct(a.server_busy, b.server_busy) / CLOCK_TICKS
    if not pinning.pinned:
        return CpuWindow(wall, roles, client, max(0.0, server_busy - server - client - own), None)
    client_busy = pct(a.client_busy, b.client_busy) / CLOCK_TICKS
    other_on_client = max(0.0, client_busy - client - own)
    return CpuWindow(wall, roles, client, max(0.0, server_busy - server), other_on_client)


def pooled(windows: Sequence[CpuWindow]) -> CpuWindow:
    """Wall-time weighted averages of several windows."""
    wall = sum(w.wall_s for w in windows)

    def mean(values: Iterable[float]) -> float:
        return sum(v * w.wall_s for v, w in zip(values, windows, strict=True)) / wall

    client_others = [w.other_on_client_cpu_pct for w in windows]
    return CpuWindow(
        wall,
        {role: mean(w.roles[role] for w in windows) for role in windows[0].roles},
        mean(w.client_pct for w in windows),
        mean(w.other_on_server_cpu_pct for w in windows),
        None if None in client_others else mean(o or 0.0 for o in client_others),
    )


def wait_for_quiet(pinning: Pinning, own_pids: list[int]) -> bool:
    """Wait (up to QUIET_WAIT_S) for half a second without foreign work on our CPUs."""
    cpus = pinning.server_cpus | pinning.client_cpus
    deadline = time.monotonic() + QUIET_WAIT_S
    while True:
        busy, own, started = busy_ticks(cpus), cpu_seconds(own_pids), time.monotonic()
        time.sleep(0.5)
        wall = time.monotonic() - started
        foreign = (busy_ticks(cpus) - busy) / CLOCK_TICKS - (cpu_seconds(own_pids) - own)
        if 100.0 * foreign / wall < QUIET_LIMIT_PCT:
            return True
        if time.monotonic() > deadline:
            return False

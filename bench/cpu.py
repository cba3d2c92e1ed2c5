"""CPU pinning and per-process CPU accounting from /proc (whole process: all its threads)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Pinning:
    """Which CPU the servers get and which the load generators (and this process) get."""

    server_cpu: int | None
    client_cpu: int | None

    @property
    def active(self) -> bool:
        return self.server_cpu is not None

    def describe(self) -> str:
        if not self.active:
            return "none (fewer than 2 usable CPUs or no affinity support)"
        server, client = self.server_cpu, self.client_cpu
        return f"servers on CPU {server}, load generators and bench driver on CPU {client}"


def choose_pinning() -> Pinning:
    """Server on the first usable CPU, everything else on the second; no pinning if impossible."""
    if not hasattr(os, "sched_getaffinity"):
        return Pinning(None, None)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return Pinning(None, None)
    return Pinning(cpus[0], cpus[1])


def pin_self(cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def pinned(argv: Sequence[str], cpu: int | None) -> list[str]:
    """`argv` prefixed with `taskset -c CPU` (affinity set before exec, so every thread has it)."""
    if cpu is None:
        return list(argv)
    taskset = shutil.which("taskset")
    if taskset is None:
        raise RuntimeError("taskset not found (util-linux); cannot pin processes")
    return [taskset, "-c", str(cpu), *argv]


def allowed_cpus(pid: int) -> set[int]:
    return set(os.sched_getaffinity(pid))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` (all threads), or 0.0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / CLOCK_TICKS


def total_cpu_seconds(pids: Iterable[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


def cpu_busy_ticks(cpus: Iterable[int]) -> dict[int, int]:
    """Busy clock ticks (everything but idle and iowait) of each CPU in `cpus`, from /proc/stat."""
    wanted = {f"cpu{cpu}": cpu for cpu in cpus}
    busy: dict[int, int] = {}
    with open("/proc/stat", encoding="ascii") as stat:
        for line in stat:
            name, *values = line.split()
            if name in wanted:
                ticks = [int(v) for v in values]
                busy[wanted[name]] = sum(ticks[:8]) - ticks[3] - ticks[4]  # up to steal
    return busy

"""What every load generator driver shares: the run shape, the target, the raw result."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ratelimit_sidecar import wire


@dataclass(frozen=True, slots=True)
class LoadShape:
    """Closed loop: `connections` HTTP/2 connections with `streams` requests in flight each.

    The first `settle_s` seconds are not measured; then `duration_s` seconds are.
    """

    connections: int
    streams: int
    settle_s: float
    duration_s: float

    @property
    def in_flight(self) -> int:
        return self.connections * self.streams


@dataclass(frozen=True, slots=True)
class Workload:
    """A set of request bodies (gRPC frames) sent round-robin."""

    name: str
    description: str
    frames: Sequence[bytes]


@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{wire.METHOD_PATH}"

    @property
    def origin(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(slots=True)
class RawResult:
    """What a driver measured in the window: OK requests, their latencies, and failures."""

    requests: int
    latencies_ms: list[float]
    errors: int = 0
    first_error: str = ""
    notes: list[str] = field(default_factory=list)
    sent: int = 0  # requests issued in the whole run, settle time included (0: not known)


class RunningLoad(Protocol):
    @property
    def pids(self) -> list[int]: ...

    def finish(self, timeout_s: float) -> RawResult: ...


class Driver(Protocol):
    """A load generator. `unavailable` says why it cannot run here (None if it can)."""

    name: str

    def unavailable(self) -> str | None: ...

    def supports(self, workload: Workload, shape: LoadShape) -> bool: ...

    def command(self) -> str: ...

    def start(
        self,
        target: Target,
        workload: Workload,
        shape: LoadShape,
        workdir: Path,
        argv_prefix: Sequence[str],
    ) -> RunningLoad: ...


@dataclass(frozen=True, slots=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str
    killed: bool


def spawn(argv: Sequence[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_all(procs: Sequence[subprocess.Popen[str]], timeout_s: float) -> list[Finished]:
    """Wait for every process, killing any still running at the deadline."""
    deadline = time.monotonic() + timeout_s
    finished: list[Finished] = []
    for proc in procs:
        killed = False
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            killed = True
        finished.append(Finished(proc.returncode, out or "", err or "", killed))
    return finished

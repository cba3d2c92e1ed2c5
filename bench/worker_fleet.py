"""The sidecar CLI with `--workers N` as a subprocess: the supervisor and its N workers.

With N > 1 the supervisor starts N workers sharing the gRPC port (SO_REUSEPORT); worker i
serves /metrics and /readyz on the metrics port + i. With N = 1 there is no supervisor: the
process itself serves. Started in its own session, so a stuck fleet can be killed as one group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

from bench import cpu
from bench.servers import free_port, wait_grpc_serving
from harness import process

STOP_TIMEOUT_S = 15.0
READY_TIMEOUT_S = 30.0
DECISIONS_METRIC = "ratelimit_sidecar_total_hits"


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(count: int) -> int:
    """A port p with p .. p+count-1 all free (each worker's metrics port)."""
    for _ in range(100):
        first = free_port()
        if all(_bindable(first + i) for i in range(1, count)):
            return first
    raise RuntimeError(f"no block of {count} free ports")


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def decisions_in(metrics_text: str) -> int:
    """Sum of the per-rule decision counters in one worker's /metrics page."""
    total = 0.0
    for line in metrics_text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith(DECISIONS_METRIC) and "_created" not in name:
            total += float(value.rsplit(" ", 1)[-1])
    return int(total)


class Fleet:
    """`python -m ratelimit_sidecar serve --workers N`, unpinned, local-only."""

    def __init__(self, workers: int, rules: Path, workdir: Path, max_keys: int) -> None:
        self.workers = workers
        self.name = f"{workers} worker" + ("s" if workers > 1 else "")
        self.address = f"127.0.0.1:{free_port()}"
        self.metrics_port = free_port_block(workers)
        self.log_path = workdir / f"workers-{workers}.log"
        argv = [sys.executable, "-m", "ratelimit_sidecar", "serve", "--config", str(rules)]
        argv += ["--grpc-address", self.address, "--workers", str(workers)]
        argv += ["--metrics-address", f"127.0.0.1:{self.metrics_port}"]
        argv += ["--max-keys", str(max_keys), "--log-level", "warning"]
        env = {**os.environ, "GRPC_VERBOSITY": "NONE"}
        self.proc = process.launch(argv, self.log_path, env=env, new_session=True)
        self._workers: list[int] = []

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @property
    def worker_pids(self) -> list[int]:
        if self.workers == 1:
            return [self.proc.pid]
        if len(self._workers) < self.workers:
            self._workers = children(self.proc.pid)
        return self._workers

    @property
    def pids(self) -> list[int]:
        return sorted({self.proc.pid, *self.worker_pids})

    def cpu_seconds(self) -> float:
        return cpu.total_cpu_seconds(self.pids)

    def wait_ready(self) -> Fleet:
        """The shared gRPC port answers, and every worker's /readyz says ready."""
        try:
            wait_grpc_serving(self.address, READY_TIMEOUT_S)
            deadline = time.monotonic() + READY_TIMEOUT_S
            for index in range(self.workers):
                self._wait_url(self._metrics_url(index, "/readyz"), deadline)
        except Exception:
            self.stop()
            tail = self.log_path.read_text()[-2000:]
            raise RuntimeError(f"sidecar with {self.name} did not start:\n{tail}") from None
        if len(self.worker_pids) != self.workers:
            self.stop()
            raise RuntimeError(f"expected {self.workers} worker processes, found {self.pids}")
        return self

    def _metrics_url(self, index: int, path: str) -> str:
        return f"http://127.0.0.1:{self.metrics_port + index}{path}"

    def _wait_url(self, url: str, deadline: float) -> None:
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(url, timeout=1) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def decisions(self) -> list[int]:
        """Decisions counted by each worker so far (from its own /metrics)."""
        counts = []
        for index in range(self.workers):
            with urllib.request.urlopen(self._metrics_url(index, "/metrics"), timeout=5) as reply:
                counts.append(decisions_in(reply.read().decode()))
        return counts

    def _signal_all(self, signum: int) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def pause(self) -> None:
        """SIGSTOP every process, so an idle fleet takes no CPU from the one measured."""
        if self.proc.poll() is None:
            self._signal_all(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc.poll() is None:
            self._signal_all(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM (the supervisor forwards it); the whole session killed if that hangs."""
        self.resume()
        process.stop_process(self.proc, timeout_s=STOP_TIMEOUT_S)
        killed = self.proc.returncode == -signal.SIGKILL
        if killed or any(_alive(pid) for pid in self._workers):
            self._kill_group()

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

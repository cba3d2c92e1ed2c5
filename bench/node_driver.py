"""bench/grpc_load.js (Node's built-in http2, no npm packages) as a gRPC load generator.

It cycles through all the workload's bodies round-robin, so it can send 100,000 distinct
descriptor values; it checks every response (HTTP 200, grpc-status 0, overall_code OK) and
writes per-request latencies for exact percentiles. The connections are split over
`processes` Node processes (each starting at its own offset in the bodies), so that no single
event loop's write batching paces the whole load.

Successive runs against the same server continue the rotation where the last one stopped, so a
section's runs together send every body, not the first few thousand again and again.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.frames import write_frames
from bench.latency import read_float64_file
from bench.loadgen import LoadShape, RawResult, Target, Workload, spawn, wait_all

SCRIPT = Path(__file__).with_name("grpc_load.js")


class NodeRun:
    def __init__(
        self,
        procs: list[subprocess.Popen[str]],
        latency_files: list[Path],
        advance: Callable[[int], None],
    ) -> None:
        self._procs = procs
        self._latency_files = latency_files
        self._advance = advance

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def finish(self, timeout_s: float) -> RawResult:
        result = RawResult(0, [])
        finished = wait_all(self._procs, timeout_s)
        for done, latency_file in zip(finished, self._latency_files, strict=True):
            lines = done.stdout.strip().splitlines()
            if done.killed or done.returncode != 0 or not lines:
                reason = "killed at the time limit" if done.killed else f"exit {done.returncode}"
                result.errors += 1
                result.first_error = result.first_error or f"node {reason}: {done.stderr[-300:]}"
                continue
            summary = json.loads(lines[-1])
            latencies = read_float64_file(latency_file)
            result.requests += len(latencies)
            result.latencies_ms.extend(latencies)
            result.errors += int(summary["errors"])
            result.first_error = result.first_error or str(summary["first_error"])
            result.sent += int(summary["sent"])
        self._advance(result.sent)
        return result


class NodeDriver:
    name = "node-http2"

    def __init__(self, processes: int = 1) -> None:
        self._binary = shutil.which("node")
        self.processes = processes
        self._offsets: dict[tuple[str, str], int] = {}  # (workload, server) -> next body

    def unavailable(self) -> str | None:
        if self._binary is None:
            return "node not installed (Debian package nodejs; see bench/ensure-tools.sh)"
        return None

    def supports(self, workload: Workload, shape: LoadShape) -> bool:  # noqa: ARG002
        return shape.connections % self.processes == 0

    def command(self) -> str:
        return "node bench/grpc_load.js (built-in http2; bodies round-robin)"

    def start(
        self,
        target: Target,
        workload: Workload,
        shape: LoadShape,
        workdir: Path,
        argv_prefix: Sequence[str],
    ) -> NodeRun:
        assert self._binary is not None
        frames = self._frames_file(workload, workdir)
        rotation, count = (workload.name, target.origin), len(workload.frames)
        base = self._offsets.get(rotation, 0)
        procs, latency_files = [], []
        for index in range(self.processes):
            latency_file = workdir / f"node-latencies-{index}.bin"
            latency_file.unlink(missing_ok=True)
            config = {
                "url": target.origin,
                "path": target.url.removeprefix(target.origin),
                "frames": str(frames),
                "offset": (base + index * count // self.processes) % count,
                "connections": shape.connections // self.processes,
                "streams": shape.streams,
                "settleS": shape.settle_s,
                "durationS": shape.duration_s,
                "latencyFile": str(latency_file),
            }
            procs.append(spawn([*argv_prefix, self._binary, str(SCRIPT), json.dumps(config)]))
            latency_files.append(latency_file)
        return NodeRun(procs, latency_files, lambda sent: self._advance(rotation, sent, count))

    def _advance(self, rotation: tuple[str, str], sent: int, count: int) -> None:
        self._offsets[rotation] = (self._offsets.get(rotation, 0) + sent) % count

    def _frames_file(self, workload: Workload, workdir: Path) -> Path:
        path = workdir / f"frames-{workload.name}.bin"
        if not path.exists():
            write_frames(path, list(workload.frames))
        return path

"""h2load as a gRPC load generator.

h2load sends one fixed body per process (`-d FILE`), so a workload of N distinct bodies runs N
h2load processes side by side, each with its own body and connections/N of the connections;
their counts are summed and their per-request logs (`--log-file`) merged for exact percentiles.
Workloads with more bodies than connections cannot be driven by h2load.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.latency import read_h2load_log
from bench.loadgen import Finished, LoadShape, RawResult, Target, Workload, spawn, wait_all

GRPC_HEADERS = ("content-type: application/grpc", "te: trailers")
_REQUESTS = re.compile(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
    r"(\d+) failed, (\d+) errored, (\d+) timeout"
)


def _millis(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


@dataclass(frozen=True, slots=True)
class _Part:
    body: Path
    log: Path
    connections: int


class H2loadRun:
    def __init__(self, procs: list[subprocess.Popen[str]], parts: list[_Part], shape: LoadShape):
        self._procs = procs
        self._parts = parts
        self._shape = shape

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def finish(self, timeout_s: float) -> RawResult:
        finished = wait_all(self._procs, timeout_s)
        result = RawResult(0, [])
        for part, done in zip(self._parts, finished, strict=True):
            _merge(result, part, done)
        return result


def _merge(result: RawResult, part: _Part, done: Finished) -> None:
    failures = _failures(done)
    if failures:
        result.errors += failures
        result.first_error = result.first_error or _describe_failure(done)
    if not part.log.exists():
        return
    log = read_h2load_log(part.log)
    result.requests += len(log.latencies_ms)
    result.latencies_ms.extend(log.latencies_ms)
    if log.non_2xx:
        result.errors += log.non_2xx
        result.first_error = result.first_error or f"{log.non_2xx} non-2xx HTTP responses"


def _failures(done: Finished) -> int:
    if done.killed or done.returncode != 0:
        return 1
    match = _REQUESTS.search(done.stdout)
    if match is None:
        return 1
    failed, errored, timeout = (int(match.group(i)) for i in (5, 6, 7))
    return failed + errored + timeout


def _describe_failure(done: Finished) -> str:
    if done.killed:
        return "h2load killed at the time limit"
    match = _REQUESTS.search(done.stdout)
    if done.returncode != 0 or match is None:
        return f"h2load exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
    return f"h2load: {match.group(0)}"


class H2loadDriver:
    name = "h2load"

    def __init__(self) -> None:
        self._binary = shutil.which("h2load")

    def unavailable(self) -> str | None:
        if self._binary is None:
            return "h2load not installed (Debian package nghttp2-client; see bench/ensure-tools.sh)"
        return None

    def supports(self, workload: Workload, shape: LoadShape) -> bool:
        return shape.connections % len(workload.frames) == 0

    def command(self) -> str:
        return "h2load -t 1 -c C -m M -D D --warm-up-time W -d BODY --log-file LOG -H grpc…"

    def start(
        self,
        target: Target,
        workload: Workload,
        shape: LoadShape,
        workdir: Path,
        argv_prefix: Sequence[str],
    ) -> H2loadRun:
        per_body = shape.connections // len(workload.frames)
        parts: list[_Part] = []
        for index, frame in enumerate(workload.frames):
            body = workdir / f"h2load-body-{index}.bin"
            body.write_bytes(frame)
            log = workdir / f"h2load-{index}.log"
            log.unlink(missing_ok=True)
            parts.append(_Part(body, log, per_body))
        procs = [spawn([*argv_prefix, *self._argv(target, shape, part)]) for part in parts]
        return H2loadRun(procs, parts, shape)

    def _argv(self, target: Target, shape: LoadShape, part: _Part) -> list[str]:
        assert self._binary is not None
        argv = [self._binary, "-t", "1", "-c", str(part.connections), "-m", str(shape.streams)]
        argv += ["-D", _millis(shape.duration_s)]
        if shape.settle_s > 0:
            argv += ["--warm-up-time", _millis(shape.settle_s)]
        argv += ["-d", str(part.body), "--log-file", str(part.log)]
        for header in GRPC_HEADERS:
            argv += ["-H", header]
        return [*argv, target.url]

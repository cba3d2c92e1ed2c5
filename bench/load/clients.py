"""The load generators: h2load and bench/grpc_load.js (Node http2) send gRPC ShouldRateLimit,
wrk sends HTTP/1.1 through Envoy. Each runs as its own processes; a run reports the requests
answered inside its measured window, their latencies, and the failures."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
import urllib.request
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc

from bench.workload import Workload, unframe
from ratelimit_sidecar import wire

NODE_SCRIPT = Path(__file__).parents[1] / "grpc_load.js"
PROBE_SAMPLES = 20


@dataclass(frozen=True, slots=True)
class LoadShape:
    """Closed loop: `connections` connections with `streams` requests in flight each; the first
    `settle_s` seconds are not measured, then `duration_s` seconds are."""

    connections: int
    streams: int
    settle_s: float
    duration_s: float


@dataclass(frozen=True, slots=True)
class Latency:
    p50_ms: float
    p99_ms: float
    max_ms: float


def percentile(ordered: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of sorted values; NaN when there are none."""
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1] if ordered else math.nan


def summarize(latencies_ms: Iterable[float]) -> Latency:
    ordered = sorted(latencies_ms)
    return Latency(percentile(ordered, 50), percentile(ordered, 99), percentile(ordered, 100))


@dataclass(slots=True)
class RawResult:
    requests: int = 0  # answered OK inside the window
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    sent: int = 0  # requests issued in the whole run (0: the client does not say)
    latency: Latency | None = None  # set by a client that reports percentiles only (wrk)
    duration_s: float | None = None  # set by a client that measures its own window (wrk)

    def fail(self, count: int, reason: str) -> None:
        self.errors += count
        self.first_error = self.first_error or reason


class RunningLoad(Protocol):
    @property
    def pids(self) -> list[int]: ...

    def finish(self, timeout_s: float) -> RawResult: ...


class Driver(Protocol):
    """A load generator: `check` sends a few requests as the load would and raises if one is
    not answered OK; `start` begins a run, its processes prefixed with `prefix` (taskset)."""

    name: str

    def unavailable(self) -> str | None: ...

    def supports(self, workload: Workload, shape: LoadShape, /) -> bool: ...

    def check(self, address: str, workload: Workload, /) -> int: ...

    def start(
        self,
        address: str,
        workload: Workload,
        shape: LoadShape,
        workdir: Path,
        prefix: list[str],
        /,
    ) -> RunningLoad: ...


@dataclass(slots=True)
class Processes:
    """Load generator processes, waited for together; their outputs are the caller's to read."""

    procs: list[subprocess.Popen[str]]

    @classmethod
    def spawn(cls, argvs: Iterable[Sequence[str]]) -> Processes:
        pipe = subprocess.PIPE
        return cls(
            [
                subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe, text=True
                )
                for argv in argvs
            ]
        )

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def wait(self, timeout_s: float) -> list[tuple[str, str, str]]:
        """(stdout, stderr, failure) per process; failure is "" unless it was killed at the
        deadline or exited non-zero."""
        deadline, done = time.monotonic() + timeout_s, []
        for proc in self.procs:
            failure = ""
            try:
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                failure = "killed at the time limit"
            if not failure and proc.returncode != 0:
                failure = f"exit {proc.returncode}: {(err or out).strip()[-300:]}"
            done.append((out, err, failure))
        return done


def grpc_check(address: str, workload: Workload) -> int:
    """Send up to PROBE_SAMPLES of the exact bodies (spread evenly) with a real gRPC client:
    each must get gRPC OK with overall_code OK. h2load counts HTTP 200 as success even when the
    gRPC status in the trailers is an error, so every timed run is preceded by this."""
    frames = workload.frames
    step = max(1.0, (len(frames) - 1) / (PROBE_SAMPLES - 1))
    sample = [frames[round(i * step)] for i in range(min(len(frames), PROBE_SAMPLES))]
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            wire.METHOD_PATH, response_deserializer=wire.RateLimitResponse.FromString
        )
        for frame in sample:
            reply = call(unframe(frame), timeout=5.0)
            if reply.overall_code != wire.Code.OK:
                code = wire.Code.Name(reply.overall_code)
                raise RuntimeError(f"{address}: overall_code {code}, expected OK")
    return len(sample)


_H2LOAD_COUNTS = re.compile(r"requests: .* (\d+) failed, (\d+) errored, (\d+) timeout")


@dataclass(slots=True)
class H2loadRun:
    """h2load sends one fixed body per process: a workload of N bodies runs N processes side by
    side, and their per-request logs (`--log-file`) are merged for exact percentiles."""

    processes: Processes
    logs: list[Path]

    @property
    def pids(self) -> list[int]:
        return self.processes.pids

    def finish(self, timeout_s: float) -> RawResult:
        result = RawResult()
        for log, (out, _, failure) in zip(self.logs, self.processes.wait(timeout_s), strict=True):
            counts = _H2LOAD_COUNTS.search(out)
            if failure or counts is None:
                result.fail(1, f"h2load {failure or 'printed no counts'}")
            elif failed := sum(int(n) for n in counts.groups()):
                result.fail(failed, f"h2load: {counts.group(0)}")
            lines = log.read_text().splitlines() if log.exists() else []
            # One line per request: start (µs since the epoch), HTTP status, µs to the response.
            for _, status, took_us, *_ in (ln.split("\t") for ln in lines if ln.count("\t") > 1):
                if status.startswith("2"):
                    result.latencies_ms.append(int(took_us) / 1000)
                else:
                    result.fail(1, f"HTTP {status} from h2load")
        result.requests = len(result.latencies_ms)
        return result


class H2load:
    name = "h2load"

    def unavailable(self) -> str | None:
        return None if shutil.which("h2load") else "h2load not installed (nghttp2-client)"

    def supports(self, workload: Workload, shape: LoadShape) -> bool:
        return shape.connections % len(workload.frames) == 0

    def check(self, address: str, workload: Workload) -> int:
        return grpc_check(address, workload)

    def start(
        self, address: str, workload: Workload, shape: LoadShape, workdir: Path, prefix: list[str]
    ) -> H2loadRun:
        per_body = str(shape.connections // len(workload.frames))
        argvs, logs = [], []
        for index, frame in enumerate(workload.frames):
            body, log = workdir / f"h2load-body-{index}.bin", workdir / f"h2load-{index}.log"
            body.write_bytes(frame)
            log.unlink(missing_ok=True)
            argv = [*prefix, "h2load", "-t", "1", "-c", per_body, "-m", str(shape.streams)]
            argv += ["-D", f"{round(shape.duration_s * 1000)}ms"]
            if shape.settle_s > 0:
                argv += ["--warm-up-time", f"{round(shape.settle_s * 1000)}ms"]
            argv += ["-d", str(body), "--log-file", str(log)]
            argv += ["-H", "content-type: application/grpc", "-H", "te: trailers"]
            argvs.append([*argv, f"http://{address}{wire.METHOD_PATH}"])
            logs.append(log)
        return H2loadRun(Processes.spawn(argvs), logs)


@dataclass(slots=True)
class NodeRun:
    processes: Processes
    latency_files: list[Path]
    driver: Node
    rotation: tuple[str, str]

    @property
    def pids(self) -> list[int]:
        return self.processes.pids

    def finish(self, timeout_s: float) -> RawResult:
        result = RawResult()
        done = self.processes.wait(timeout_s)
        for path, (out, err, failure) in zip(self.latency_files, done, strict=True):
            if failure or not out.strip():
                result.fail(1, f"node {failure or 'printed nothing'}: {err[-300:]}")
                continue
            summary = json.loads(out.strip().splitlines()[-1])
            latencies = array("d", path.read_bytes()).tolist()  # float64 ms, little-endian
            result.latencies_ms.extend(latencies)
            result.fail(int(summary["errors"]), str(summary["first_error"]))
            result.sent += int(summary["sent"])
        result.requests = len(result.latencies_ms)
        self.driver.offsets[self.rotation] = self.driver.offsets.get(self.rotation, 0) + result.sent
        return result


class Node:
    """bench/grpc_load.js: cycles through all of a workload's bodies (so it can send 100,000
    distinct values) and checks every response (HTTP 200, grpc-status 0, overall_code OK).
    Successive runs against one server continue the rotation where the last one stopped, so
    together they send every body rather than the first few thousand again and again."""

    name = "node-http2"

    def __init__(self) -> None:
        self.offsets: dict[tuple[str, str], int] = {}  # (workload, server) -> bodies sent

    def unavailable(self) -> str | None:
        return None if shutil.which("node") else "node not installed (nodejs)"

    def supports(self, _workload: Workload, _shape: LoadShape) -> bool:
        return True

    def check(self, address: str, workload: Workload) -> int:
        return grpc_check(address, workload)

    def start(
        self, address: str, workload: Workload, shape: LoadShape, workdir: Path, prefix: list[str]
    ) -> NodeRun:
        frames = workdir / f"frames-{workload.name}.bin"
        if not frames.exists():
            frames.write_bytes(b"".join(workload.frames))  # self-delimiting frames
        rotation = (workload.name, address)
        latency_file = workdir / "node-latencies.bin"
        latency_file.unlink(missing_ok=True)
        config = {
            "url": f"http://{address}",
            "path": wire.METHOD_PATH,
            "frames": str(frames),
            "offset": self.offsets.get(rotation, 0) % len(workload.frames),
            "connections": shape.connections,
            "streams": shape.streams,
            "settleS": shape.settle_s,
            "durationS": shape.duration_s,
            "latencyFile": str(latency_file),
        }
        argv = [*prefix, "node", str(NODE_SCRIPT), json.dumps(config)]
        return NodeRun(Processes.spawn([argv]), [latency_file], self, rotation)


WRK_DONE_LUA = """\
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRK_RESULT requests=%d duration_us=%d non_2xx=%d socket_errors=%d"
    .. " p50_us=%d p99_us=%d max_us=%d\\n",
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"""


@dataclass(slots=True)
class WrkRun:
    processes: Processes

    @property
    def pids(self) -> list[int]:
        return self.processes.pids

    def finish(self, timeout_s: float) -> RawResult:
        out, _, failure = self.processes.wait(timeout_s)[0]
        found = re.search(r"^WRK_RESULT (.*)$", out, re.MULTILINE)
        if failure or found is None:
            return RawResult(errors=1, first_error=f"wrk {failure or 'printed no WRK_RESULT'}")
        values = {k: int(v) for k, v in (item.split("=") for item in found.group(1).split())}
        result = RawResult(values["requests"], duration_s=values["duration_us"] / 1e6)
        result.latency = Latency(*(values[k] / 1000 for k in ("p50_us", "p99_us", "max_us")))
        if values["non_2xx"]:
            result.fail(values["non_2xx"], f"{values['non_2xx']} non-2xx responses")
        if values["socket_errors"]:
            result.fail(values["socket_errors"], f"{values['socket_errors']} socket errors")
        return result


class Wrk:
    """wrk over HTTP/1.1, one request in flight per connection, whole seconds only (a `done()`
    Lua hook prints its counts and percentiles in one machine-readable line)."""

    name = "wrk"

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers

    def unavailable(self) -> str | None:
        return None if shutil.which("wrk") else "wrk not installed (wrk)"

    def supports(self, _workload: Workload, shape: LoadShape) -> bool:
        return shape.settle_s == 0 and shape.duration_s == int(shape.duration_s)

    def check(self, address: str, _workload: Workload) -> int:
        """One request: 200 with x-ratelimit headers, so the rate limit service answered."""
        request = urllib.request.Request(f"http://{address}/", headers=self.headers)
        with urllib.request.urlopen(request, timeout=5) as reply:
            if reply.status != 200 or reply.headers.get("x-ratelimit-limit") is None:
                raise RuntimeError(f"{address}: {reply.status}, headers {dict(reply.headers)}")
        return 1

    def start(
        self, address: str, _workload: Workload, shape: LoadShape, workdir: Path, prefix: list[str]
    ) -> WrkRun:
        script = workdir / "wrk-done.lua"
        script.write_text(WRK_DONE_LUA)
        argv = [*prefix, "wrk", "-t", "1", "-c", str(shape.connections)]
        argv += ["-d", f"{int(shape.duration_s)}s", "--latency", "-s", str(script)]
        for name, value in self.headers.items():
            argv += ["-H", f"{name}: {value}"]
        return WrkRun(Processes.spawn([[*argv, f"http://{address}/"]]))

"""The load generators, each as its own processes: h2load and bench/rawload.py (HTTP/2 by hand)
send gRPC ShouldRateLimit, wrk HTTP/1.1 through Envoy. A run reports the requests answered in its
window, their latencies and the failures.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bench.workload import Workload, unframe
from harness.grpc_client import rls_stub
from ratelimit_sidecar._proto import wire

RAWLOAD = Path(__file__).parents[1] / "rawload.py"
PROBE_SAMPLES = 20


@dataclass(frozen=True, slots=True)
class LoadShape:
    """Closed loop: `connections` connections with `streams` requests in flight each; the first
    `settle_s` seconds are not measured, then `duration_s` seconds are."""

    connections: int
    streams: int
    settle_s: float
    duration_s: float
    rps: int = 0  # paced at this many requests per second in all (h2load only); 0: closed loop


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


Output = tuple[str, str, str]  # a process's stdout, stderr, and why it failed ("" if it did not)


@dataclass(slots=True)
class Load:
    """A started run: the load generator's processes, and how to read what they left."""

    procs: list[subprocess.Popen[str]]
    read: Callable[[list[Output]], RawResult]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def finish(self, timeout_s: float) -> RawResult:
        """Wait for every process (killing any still running at the deadline), then read."""
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
        return self.read(done)


def spawn(argvs: Iterable[list[str]], read: Callable[[list[Output]], RawResult]) -> Load:
    pipe, devnull = subprocess.PIPE, subprocess.DEVNULL
    procs = [subprocess.Popen(a, stdin=devnull, stdout=pipe, stderr=pipe, text=True) for a in argvs]
    return Load(procs, read)


class Client:
    """A load generator: `check` sends a few requests as the load would and raises if one is
    not answered OK; `start` begins a run, its command lines prefixed with `prefix` (taskset)."""

    name = binary = package = ""

    def unavailable(self) -> str | None:
        if shutil.which(self.binary):
            return None
        return f"{self.binary} not installed (package {self.package}; see bench/ensure-tools.sh)"

    def check(self, address: str, workload: Workload) -> None:
        """Up to PROBE_SAMPLES of the exact bodies (spread evenly) through a real gRPC client:
        each must get gRPC OK with overall_code OK (h2load counts HTTP 200 as a success even
        when the gRPC status in the trailers is an error)."""
        frames = workload.frames
        step = max(1.0, (len(frames) - 1) / (PROBE_SAMPLES - 1))
        sample = [frames[round(i * step)] for i in range(min(len(frames), PROBE_SAMPLES))]
        with grpc.insecure_channel(address) as channel:
            call = rls_stub(channel).ShouldRateLimit
            for frame in sample:
                message = wire.RateLimitRequest.FromString(unframe(frame))
                code = call(message, timeout=5.0).overall_code
                if code != wire.Code.OK:
                    raise RuntimeError(f"{address}: {wire.Code.Name(code)}, expected OK")

    def start(
        self, address: str, workload: Workload, shape: LoadShape, workdir: Path, prefix: list[str]
    ) -> Load:
        raise NotImplementedError


_H2LOAD_COUNTS = re.compile(r"requests: .* (\d+) failed, (\d+) errored, (\d+) timeout")


class H2load(Client):
    """h2load sends one fixed body per process: a workload of N bodies runs N processes side by
    side, each with connections/N connections, and their per-request logs are merged."""

    name, binary, package = "h2load", "h2load", "nghttp2-client"

    def start(
        self, address: str, workload: Workload, shape: LoadShape, workdir: Path, prefix: list[str]
    ) -> Load:
        per_body, rest = divmod(shape.connections, len(workload.frames))
        if rest or not per_body:
            raise ValueError(f"h2load cannot spread {shape.connections} connections evenly")
        argv = [*prefix, "h2load", "-t", "1", "-c", str(per_body), "-m", str(shape.streams)]
        argv += ["-D", f"{round(shape.duration_s * 1000)}ms"]
        argv += ["--rps", str(max(1, shape.rps // shape.connections))] if shape.rps else []
        argv += ["--warm-up-time", f"{round(shape.settle_s * 1000)}ms"] if shape.settle_s else []
        argv += ["-H", "content-type: application/grpc", "-H", "te: trailers"]
        argvs, logs, url = [], [], f"http://{address}{wire.METHOD_PATH}"
        for index, frame in enumerate(workload.frames):
            body, log = workdir / f"h2load-body-{index}.bin", workdir / f"h2load-{index}.log"
            body.write_bytes(frame)
            log.unlink(missing_ok=True)
            argvs.append([*argv, "-d", str(body), "--log-file", str(log), url])
            logs.append(log)
        return spawn(argvs, lambda done: self.read(logs, done))

    @staticmethod
    def read(logs: list[Path], done: list[Output]) -> RawResult:
        result = RawResult()
        for log, (out, _, failure) in zip(logs, done, strict=True):
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


def frames_file(workload: Workload, workdir: Path) -> Path:
    """The workload's bodies in one file, back to back (gRPC frames delimit themselves)."""
    frames = workdir / f"frames-{workload.name}.bin"
    if not frames.exists():
        frames.write_bytes(b"".join(workload.frames))
    return frames


class RawLoad(Client):
    """bench/rawload.py (Python, one process): cycles through all of a workload's bodies (so it
    can send 100,000 distinct values) and checks every answer (grpc-status 0, overall_code OK).
    Runs against one server continue the rotation, so together they send every body."""

    name, binary = "raw-http2", sys.executable

    def __init__(self) -> None:
        self.offsets: dict[tuple[str, str], int] = {}  # (workload, server) -> next body

    def start(
        self, address: str, workload: Workload, shape: LoadShape, workdir: Path, prefix: list[str]
    ) -> Load:
        frames = frames_file(workload, workdir)
        rotation, latency_file = (workload.name, address), workdir / "rawload-latencies.bin"
        latency_file.unlink(missing_ok=True)
        config = {
            "address": address, "path": wire.METHOD_PATH, "frames": str(frames),
            "offset": self.offsets.get(rotation, 0), "connections": shape.connections,
            "streams": shape.streams, "settleS": shape.settle_s, "durationS": shape.duration_s,
            "latencyFile": str(latency_file),
        }  # fmt: skip

        def read(done: list[Output]) -> RawResult:
            (out, err, failure), result = done[0], RawResult()
            if failure or not out.strip():
                result.fail(1, f"rawload {failure or 'printed nothing'}: {err[-300:]}")
                return result
            summary = json.loads(out.strip().splitlines()[-1])
            result.latencies_ms = array("d", latency_file.read_bytes()).tolist()  # float64 ms
            result.requests, result.sent = len(result.latencies_ms), int(summary["sent"])
            result.fail(int(summary["errors"]), str(summary["first_error"]))
            self.offsets[rotation] = int(summary["next_offset"])
            return result

        return spawn([[*prefix, sys.executable, str(RAWLOAD), json.dumps(config)]], read)


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


class Wrk(Client):
    """wrk over HTTP/1.1, one request in flight per connection, whole seconds only; a `done()`
    Lua hook prints its counts and percentiles in one machine-readable line."""

    name, binary, package = "wrk", "wrk", "wrk"

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers

    def check(self, address: str, _workload: Workload) -> None:
        """One request answered 200 (whether the service decided it, a section's counters say)."""
        request = urllib.request.Request(f"http://{address}/", headers=self.headers)
        with urllib.request.urlopen(request, timeout=5) as reply:
            if reply.status != 200:
                raise RuntimeError(f"{address}: HTTP {reply.status}")

    def start(  # wrk sends one request, whatever the workload
        self, address: str, _workload: Workload, shape: LoadShape, workdir: Path, prefix: list[str]
    ) -> Load:
        if shape.settle_s or shape.duration_s != int(shape.duration_s):
            raise ValueError("wrk runs whole seconds, without settle time")
        script = workdir / "wrk-done.lua"
        script.write_text(WRK_DONE_LUA)
        argv = [*prefix, "wrk", "-t", "1", "-c", str(shape.connections)]
        argv += ["-d", f"{int(shape.duration_s)}s", "--latency", "-s", str(script)]
        for name, value in self.headers.items():
            argv += ["-H", f"{name}: {value}"]
        return spawn([[*argv, f"http://{address}/"]], self.read)

    @staticmethod
    def read(done: list[Output]) -> RawResult:
        out, _, failure = done[0]
        found = re.search(r"^WRK_RESULT (.*)$", out, re.MULTILINE)
        if failure or found is None:
            return RawResult(errors=1, first_error=f"wrk {failure or 'printed no WRK_RESULT'}")
        values = {k: int(v) for k, v in (item.split("=") for item in found.group(1).split())}
        result = RawResult(values["requests"], duration_s=values["duration_us"] / 1e6)
        result.latency = Latency(*(values[k] / 1000 for k in ("p50_us", "p99_us", "max_us")))
        for name in ("non_2xx", "socket_errors"):
            if values[name]:
                result.fail(values[name], f"{values[name]} {name.replace('_', ' ')}")
        return result

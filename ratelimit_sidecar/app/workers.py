"""`--workers N`: N sidecar processes sharing one gRPC port through SO_REUSEPORT.

Each worker is a node of its own (node id `<id>-w<i>`, its own counters and Redis heartbeat),
so the fleet algorithm treats workers like any other sidecars. Metrics use per-worker ports
(`--metrics-address` port + i) rather than prometheus multiprocess mode: each worker's numbers
stay exact and self-describing, and Prometheus sums them with `sum by (...)`.
The parent only supervises: it forwards SIGTERM/SIGINT, waits for every worker to flush and
exit, and exits non-zero if any worker did.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from types import FrameType

from ratelimit_sidecar.app.flags import environment
from ratelimit_sidecar.app.settings import REUSE_PORT_ENV, Settings
from ratelimit_sidecar.http_server.admin import ADMIN_OFF
from ratelimit_sidecar.http_server.admin_token import admin_token_configured

log = logging.getLogger("ratelimit_sidecar.workers")
POLL_S = 0.2
WORKER_COMMAND = (sys.executable, "-m", "ratelimit_sidecar", "serve")


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


def worker_settings(settings: Settings, index: int) -> Settings:
    """The parent's settings, as one node of its own with its own metrics port."""
    host, port = split_address(settings.metrics_address)
    return replace(
        settings,
        node_id=f"{settings.node_id}-w{index}",
        metrics_address=f"{host}:{port + index if port else 0}",
        # One admin API, on the first worker: writes have one way in (the others follow the
        # store: Redis's change messages, or the state file at their next read).
        admin_address=settings.admin_address if index == 0 else ADMIN_OFF,
        workers=1,
    )


def _ports_overlap(settings: Settings) -> str:
    """Why the admin port cannot be used beside the workers' metrics ports ("" if it can)."""
    metrics, admin = split_address(settings.metrics_address)[1], settings.admin_address
    if admin == ADMIN_OFF or not metrics or not admin_token_configured(settings.admin_token_file):
        return ""
    port = split_address(admin)[1]
    last = metrics + settings.workers - 1
    if metrics <= port <= last:
        return f"--admin-address port {port} is one of the workers' metrics ports {metrics}-{last}"
    return ""


def worker_env(settings: Settings) -> dict[str, str]:
    """Every setting travels by environment, not argv: the Redis password never shows in `ps`."""
    return {**os.environ, **environment(settings), REUSE_PORT_ENV: "1"}


def run_workers(settings: Settings) -> int:
    if split_address(settings.grpc_address)[1] == 0:
        print("ratelimit-sidecar: error: --workers needs a fixed gRPC port", file=sys.stderr)
        return 1
    overlap = _ports_overlap(settings)
    if overlap:
        print(f"ratelimit-sidecar: error: {overlap}; choose another port", file=sys.stderr)
        return 1
    children = [
        subprocess.Popen(
            WORKER_COMMAND, env=worker_env(worker_settings(settings, i)), stdin=subprocess.DEVNULL
        )
        for i in range(settings.workers)
    ]
    stopping = _forward_signals(children)
    return _supervise(children, stopping)


def _forward_signals(children: list[subprocess.Popen[bytes]]) -> list[bool]:
    stopping = [False]

    def forward(signum: int, _frame: FrameType | None) -> None:
        stopping[0] = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return stopping


def _supervise(children: list[subprocess.Popen[bytes]], stopping: list[bool]) -> int:
    """Wait for all workers; if one dies on its own, stop the others (the service is degraded)."""
    while any(child.poll() is None for child in children):
        if not stopping[0] and any(child.poll() is not None for child in children):
            log.error("a worker exited unexpectedly; stopping the others")
            stopping[0] = True
            for child in children:
                if child.poll() is None:
                    child.terminate()
        time.sleep(POLL_S)
    codes = [child.returncode for child in children]
    return int(max(abs(code) for code in codes))

"""The servers under load: the sidecar CLI and bench/services.py's services, each a subprocess on
the server CPUs, stopped while another is measured.
"""

from __future__ import annotations

import itertools
import os
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc

from bench.load.runs import Bench
from bench.workload import RULES_YAML, rules_dir
from harness.net import free_port, wait_grpc_serving
from harness.process import launch, pause, python_module, resume, stop_process
from harness.sidecar import serve_args

READY_TIMEOUT_S = 30.0


def local_address() -> str:
    return f"127.0.0.1:{free_port()}"


class ServerProcess:
    """`python -m MODULE …` under `taskset`, output in `<name>.log`, leading its own process
    group (so that signals reach any worker process it forks); ready once made."""

    def __init__(
        self,
        name: str,
        module_args: list[str],
        address: str,
        bench: Bench,
        *,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name, self.address = name, address
        self.log = bench.workdir / f"{name}.log"
        metrics = dict(itertools.pairwise(module_args)).get("--metrics-address")
        self.metrics_url = f"http://{metrics}/metrics" if metrics else ""  # a sidecar's
        argv = bench.pinning.taskset(python_module(*module_args), bench.pinning.server_cpus)
        tree = (env or {}).get("PYTHONPATH")  # `-m` puts the cwd first: run in that tree
        env = {**os.environ, "GRPC_VERBOSITY": "NONE", **(env or {})}
        cwd = Path(tree) if tree else None
        self.proc = launch(argv, self.log, env=env, cwd=cwd, new_session=True)
        self.wait_ready()

    @property
    def pids(self) -> list[int]:
        """Its process and any worker process it forked."""
        pid = self.proc.pid
        try:
            return [pid, *map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]
        except OSError:
            return [pid]

    def roles(self) -> dict[str, list[int]]:
        return {"server": self.pids}

    def counters(self) -> dict[str, int]:
        """Counters read before and after each run (none here)."""
        return {}

    def metrics(self, prefix: str, url: str = "") -> dict[str, float]:
        """The samples of its /metrics (or `url`'s) whose names start with `prefix`."""
        with urllib.request.urlopen(url or self.metrics_url, timeout=5) as reply:
            lines = reply.read().decode().splitlines()
        return samples(lines, prefix)

    def wait_ready(self) -> None:
        """Until its gRPC health service says SERVING; else stopped and RuntimeError."""
        try:
            wait_grpc_serving(self.address, READY_TIMEOUT_S)
        except (grpc.RpcError, TimeoutError):
            self.stop()
            tail = self.log.read_text()[-2000:]
            raise RuntimeError(f"{self.name} did not start:\n{tail}") from None

    def pause(self) -> None:
        pause(self.proc, group=True)

    def resume(self) -> None:
        resume(self.proc, group=True)

    def stop(self) -> None:
        stop_process(self.proc, group=True)


def samples(lines: Sequence[str], prefix: str) -> dict[str, float]:
    """Prometheus text samples whose names start with `prefix`, less the prefix (no `_created`)."""
    found = {}
    for line in lines:
        name, _, value = line.rpartition(" ")
        if name.startswith(prefix) and "_created" not in name:
            found[name.removeprefix(prefix)] = float(value)
    return found


def sidecar_args(address: str, rules: Path, *extra: str) -> list[str]:
    """`serve` for the rules directory, local-only unless `extra` adds a store."""
    flags = ("--log-level", "warning", *extra)
    return ["ratelimit_sidecar", *serve_args(rules, address, local_address(), *flags)]


def start_sidecar(
    bench: Bench,
    *extra: str,
    rules: str = RULES_YAML,
    name: str = "sidecar",
    env: Mapping[str, str] | None = None,
) -> ServerProcess:
    """The sidecar on the `rules` text, named `name` in tables and in its log and rules
    directory's name; `env` added to ours."""
    address = local_address()
    args = sidecar_args(address, rules_dir(bench.workdir, rules, name), *extra)
    return ServerProcess(name, args, address, bench, env=env)


def start_service(bench: Bench, kind: str, *extra: str) -> ServerProcess:
    """One of bench/services.py's services, named after its kind."""
    address = local_address()
    args = ["bench.services", kind, "--address", address, *extra]
    return ServerProcess(kind, args, address, bench)

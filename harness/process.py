"""Child processes: starting, signalling, waiting until ready and stopping, every wait bounded."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

STOP_TIMEOUT_S = 10.0
KILL_TIMEOUT_S = 5.0

Process = subprocess.Popen[Any]


class NotReady(RuntimeError):
    """A process exited, or did not become ready in time."""


def python_module(*args: str) -> list[str]:
    """`python -m ARGS` with this interpreter (the venv's, so the project is importable)."""
    return [sys.executable, "-m", *args]


def launch(
    argv: Sequence[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    append: bool = False,
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start `argv` with stdin from /dev/null and stdout and stderr both written to `log`.

    `new_session` makes the child the leader of its own process group, so a `group` signal
    also reaches whatever it forks.
    """
    with log.open("ab" if append else "wb") as out:  # the child keeps its own copy of the fd
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
        )


def send_signal(proc: Process, sig: int, *, group: bool = False) -> None:
    """`sig` to a process still running (to its whole process group if `group`)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


def pause(proc: Process, *, group: bool = False) -> None:
    """SIGSTOP: the process keeps its sockets open but runs nothing until `resume`."""
    send_signal(proc, signal.SIGSTOP, group=group)


def resume(proc: Process, *, group: bool = False) -> None:
    send_signal(proc, signal.SIGCONT, group=group)


def stop_process(
    proc: Process,
    *,
    sig: int = signal.SIGTERM,
    timeout_s: float = STOP_TIMEOUT_S,
    group: bool = False,
) -> tuple[Any, Any]:
    """Send `sig`, wait up to `timeout_s`, then SIGKILL and wait up to KILL_TIMEOUT_S.

    A paused process is continued after the signal, so it can act on it. Returns what the
    process wrote to its stdout and stderr pipes (None for a stream that is not a pipe).
    Calling it on a process that already ended only collects that output.
    """
    send_signal(proc, sig, group=group)
    resume(proc, group=group)
    try:
        return proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        send_signal(proc, signal.SIGKILL, group=group)
        return proc.communicate(timeout=KILL_TIMEOUT_S)


def wait_ready(
    ready: Callable[[], bool],
    proc: Process | None,
    timeout_s: float,
    interval_s: float = 0.05,
) -> None:
    """Poll `ready` until it returns True; NotReady if `proc` exits or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise NotReady(f"exited with code {proc.returncode}")
        if time.monotonic() > deadline:
            raise NotReady(f"not ready after {timeout_s:g} s")
        time.sleep(interval_s)

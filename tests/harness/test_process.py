"""The harness's process control: stopping is bounded, paused processes stop, waits give up."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.process import NotReady, launch, pause, stop_process, wait_ready

SLEEPER = "import signal, time\n{setup}\nprint('ready', flush=True)\ntime.sleep(60)\n"


def _started(setup: str = "") -> subprocess.Popen[str]:
    """A Python child that says `ready` on stdout after `setup`, then sleeps for a minute."""
    code = SLEEPER.format(setup=setup)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_a_process_that_ignores_sigterm_is_killed_after_the_timeout() -> None:
    proc = _started("signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    started = time.monotonic()
    stop_process(proc, timeout_s=0.3)
    assert proc.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 5


def test_a_paused_process_acts_on_the_signal() -> None:
    proc = _started()
    pause(proc)
    stop_process(proc, timeout_s=5)
    assert proc.returncode == -signal.SIGTERM


def test_output_written_to_pipes_is_returned_once_stopped() -> None:
    # SIGINT's default handler set anew: a child of a shell's background job inherits it ignored.
    code = (
        "import signal, sys, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "sys.stderr.write('bye')\nsys.stderr.flush()\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    assert proc.stderr.read(3) == "bye"
    _, err = stop_process(proc, sig=signal.SIGINT, timeout_s=5)
    assert "KeyboardInterrupt" in err
    assert proc.returncode == -signal.SIGINT  # Python re-raises an uncaught SIGINT
    assert stop_process(proc)[1] is not None  # a second call only collects, never signals


def test_launch_writes_stdout_and_stderr_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    code = "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\n"
    proc = launch([sys.executable, "-c", code], log)
    assert proc.wait(timeout=10) == 0
    assert log.read_text().splitlines() == ["to stdout", "to stderr"]


def test_wait_ready_reports_a_process_that_exited(tmp_path: Path) -> None:
    proc = launch([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "log")
    with pytest.raises(NotReady, match="exited with code 3"):
        wait_ready(lambda: False, proc, timeout_s=10)


def test_wait_ready_gives_up_at_the_deadline() -> None:
    with pytest.raises(NotReady, match=r"not ready after 0\.2 s"):
        wait_ready(lambda: False, None, timeout_s=0.2, interval_s=0.01)


def test_wait_ready_returns_once_the_probe_says_ready() -> None:
    answers = iter([False, False, True])
    wait_ready(lambda: next(answers), None, timeout_s=10, interval_s=0.01)
    assert next(answers, "drained") == "drained"

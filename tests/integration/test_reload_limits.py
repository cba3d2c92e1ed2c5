"""Hostile and huge rule files against a running sidecar: refused without stalling anything."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from harness.hostile_rules import (
    GOOD_RULES,
    alias_bomb,
    alias_cycle,
    many_descriptors,
    sparse_file,
)
from harness.sidecar import SidecarProcess, run_cli
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.app.sidecar import Sidecar
from ratelimit_sidecar.config.loader import load_rules

MIB = 1024 * 1024
ERRORS = "ratelimit_sidecar_config_load_errors_total"


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[Sidecar, Path]]:
    path = tmp_path / "r.yaml"
    path.write_text(GOOD_RULES)
    settings = Settings(
        config_path=str(path),
        grpc_address="127.0.0.1:0",
        metrics_address="127.0.0.1:0",
        reload_poll_s=0.05,
    )
    sidecar = Sidecar(settings, load_rules(path))
    await sidecar.startup()
    yield sidecar, path
    await sidecar.shutdown()


def errors_reach(sidecar: Sidecar, count: int) -> Callable[[], bool]:
    """Whether `count` failed loads have been counted."""
    return lambda: (sidecar.metrics.registry.get_sample_value(ERRORS) or 0) >= count


async def until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        await asyncio.sleep(0.02)


def vm_rss_mb() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def write_hostile(path: Path, kind: str) -> None:
    if kind == "huge":
        path.unlink()
        sparse_file(path, 50 * MIB)
    else:
        path.write_text(alias_bomb() if kind == "bomb" else alias_cycle())


async def test_a_good_file_written_after_hostile_ones_is_loaded(
    running: tuple[Sidecar, Path],
) -> None:
    sidecar, path = running
    good = sidecar.handler.rules.version
    rss_before = vm_rss_mb()
    for count, kind in enumerate(("bomb", "huge", "cycle"), start=1):
        write_hostile(path, kind)
        await until(errors_reach(sidecar, count))
        assert sidecar.handler.rules.version == good
    growth = vm_rss_mb() - rss_before
    path.write_text(GOOD_RULES.replace("requests_per_unit: 5", "requests_per_unit: 7"))
    await until(lambda: sidecar.handler.rules.version != good)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sidecar.port}") as channel:
        reply = await rls_stub(channel).ShouldRateLimit(request("d", [("k", "v")]))
    assert reply.statuses[0].limit_remaining == 6
    assert growth < 32, f"memory grew {growth:.0f} MB while refusing hostile files"


async def test_answers_stay_fast_while_files_are_refused(running: tuple[Sidecar, Path]) -> None:
    sidecar, path = running
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{sidecar.port}") as channel:
        stub = rls_stub(channel)
        for count, kind in enumerate(("bomb", "huge"), start=1):
            write_hostile(path, kind)
            await _measure(stub, latencies, errors_reach(sidecar, count))
        # A file under every limit that takes seconds to load, then is refused at its end.
        path.write_text(many_descriptors(8000, bad_unit_at_end=True))
        await _measure(stub, latencies, errors_reach(sidecar, 3))
    latencies.sort()
    p99 = latencies[int(0.99 * len(latencies))]
    assert len(latencies) >= 200, "the loads ended before answers could be measured"
    assert p99 < 0.05, f"p99 {p99 * 1000:.1f} ms over {len(latencies)} answers"


async def _measure(stub: Any, latencies: list[float], done: Callable[[], bool]) -> None:
    """Time ShouldRateLimit calls until `done()`; bounded to 20,000 calls and 20 s."""
    deadline = time.monotonic() + 20
    for _ in range(20_000):
        if done() or time.monotonic() > deadline:
            return
        started = time.perf_counter()
        await stub.ShouldRateLimit(request("d", [("k", "v")]))
        latencies.append(time.perf_counter() - started)
    raise AssertionError("the file was not refused within 20,000 answers")


def test_sigterm_during_a_long_reload_exits_promptly(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(GOOD_RULES)
    sidecar = SidecarProcess(path, "--reload-poll-s", "0.05").wait_ready()
    try:
        path.write_text(many_descriptors(40_000, bad_unit_at_end=True))  # about 9 s to load
        assert path.stat().st_size < 4 * MIB
        time.sleep(1.0)  # the watcher has seen it and the load is under way
    finally:
        started = time.monotonic()
        code = sidecar.stop(signal.SIGTERM)
        took = time.monotonic() - started
    assert code == 0, sidecar.stderr
    assert "stopped" in sidecar.stderr
    assert took < 2.0, f"exit took {took:.2f} s"


@pytest.mark.parametrize("kind", ["bomb", "huge", "cycle"])
def test_check_refuses_a_hostile_file_fast_in_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("")
    write_hostile(path, kind)

    started = time.monotonic()
    result = run_cli(["check", str(path)], timeout_s=10)
    took = time.monotonic() - started

    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line.startswith(f"{path}:")
    assert took < 2.0, f"check took {took:.2f} s"

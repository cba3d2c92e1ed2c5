"""The fuzz target (tests/fuzz/target.py) on hypothesis' bytes: CI's short fuzzing run, in both
of the target's modes, bounded to well under a minute. The coverage-guided run is atheris'
(tests/fuzz/protocol_fuzz.py); `test_atheris_briefly` runs it for 40 s with `-m fuzz`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import target

ROOT = Path(__file__).resolve().parents[4]
LIMITS = st.integers(0, len(target.LIMITS) - 1)
# Raw mode: the client's stream, often starting with a valid preface and SETTINGS.
RAW = st.builds(
    lambda variant, step, start, rest: bytes((0, variant, step)) + start + rest,
    LIMITS,
    st.integers(0, 255),
    st.sampled_from([b"", target.HANDSHAKE, target.HANDSHAKE[:30]]),
    st.binary(max_size=600),
)
# Structured mode: operations, drawn opcode by opcode so that most of them are meaningful.
OPERATION = st.tuples(st.integers(0, 11), st.binary(min_size=0, max_size=24)).map(
    lambda op: bytes((op[0],)) + op[1]
)
STRUCTURED = st.builds(
    lambda variant, ops: bytes((1, variant)) + b"".join(ops),
    LIMITS,
    st.lists(OPERATION, max_size=40),
)
INPUTS = st.one_of(RAW, STRUCTURED, st.binary(max_size=400))


@settings(
    max_examples=6000,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(INPUTS)
def test_no_input_breaks_an_invariant(data: bytes) -> None:
    assert set(target.run(data)) <= set(target.KNOWN_FINDINGS)


@pytest.mark.parametrize("variant", range(len(target.LIMITS)))
def test_the_structured_mode_reaches_answered_calls(variant: int) -> None:
    """A unary call and a streaming one in the structured mode's operations, each answered:
    the target drives the core past the handshake, through whole calls."""
    unary = bytes((1, 0, 0, 0, 0, 3, 0, 1, 0, 5, 11))  # HEADERS; DATA, END_STREAM; answer
    streaming = bytes((
        1, 0, 0, 1, 0,  # HEADERS on the streaming path
        3, 0, 0, 0, 5,  # a message
        7, 5, 0, 0,  # consumed
        3, 0, 1, 2, 0,  # END_STREAM
        7, 1, 0, 1,  # a response message
        7, 3, 0, 0, 0,  # OK
    ))  # fmt: skip
    for ops in (unary, streaming):
        harness = target.Harness(variant, strict=True)
        target.structured(harness, target.Input(ops))
        assert 1 in harness.client.ended and 1 in harness.client.headers_seen
        harness.lose()


@pytest.mark.fuzz
def test_atheris_briefly(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """atheris for 40 s from an empty corpus; run with `pytest -m fuzz`."""
    if "fuzz" not in (request.config.option.markexpr or ""):
        pytest.skip("atheris runs with -m fuzz")
    pytest.importorskip("atheris")
    script = ROOT / "tests/fuzz/protocol_fuzz.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable, str(script), str(tmp_path), f"-dict={ROOT / 'tests/fuzz/http2.dict'}",
        "-max_total_time=40", "-max_len=4096", "-print_final_stats=1",
        f"-artifact_prefix={tmp_path}/",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90, check=False
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "stat::number_of_executed_units" in log
    assert time.monotonic() - started < 60

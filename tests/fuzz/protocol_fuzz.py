"""Coverage-guided fuzzing of the protocol core with atheris (libFuzzer): the frame parser,
HPACK handling and gRPC framing, through `Connection.receive` (target.py says how the input
drives it and which invariants it checks).

Run from the repository's root, on the pure-Python sources (atheris measures coverage of Python
bytecode; the mypyc build's extension modules would hide it), e.g. for an hour:

    .venv/bin/python tests/fuzz/protocol_fuzz.py --seeds fuzz-corpus
    .venv/bin/python tests/fuzz/protocol_fuzz.py fuzz-corpus \
        -dict=tests/fuzz/http2.dict -max_total_time=3600 -print_final_stats=1

`--seeds DIR` writes the seed corpus: the client byte streams of the protocol core's unit tests
(tests/unit/grpc_server/protocol, recorded as they run), in both modes. Every other argument is
libFuzzer's. A crash leaves `crash-<sha1>` in the working directory: replay it with
`protocol_fuzz.py crash-<sha1>`, or `target.run(open(path, "rb").read())` in a test.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# The sources, not the compiled build: tests/unit/conftest.py's finder, ahead of the default.
os.environ["SIDECAR_SOURCES_ONLY"] = "1"
import tests.unit.conftest  # noqa: E402, F401  (installs the finder)

MAX_CHUNK = 2047  # a structured RAW operation's largest chunk
MAX_SEED = 32 * 1024  # the long run's -max_len


def fuzz(argv: list[str]) -> None:
    import atheris  # type: ignore[import-untyped]

    with atheris.instrument_imports(include=["ratelimit_sidecar", "hpack"]):
        from ratelimit_sidecar.grpc_server.protocol import connection
        from tests.fuzz import target
    assert connection.__file__ is not None and connection.__file__.endswith(".py")
    atheris.Setup(argv, target.run)
    atheris.Fuzz()


class Recorder:
    """A pytest plugin: the bytes every Connection receives, one stream per connection."""

    def __init__(self) -> None:
        self.streams: list[list[bytes]] = []

    def pytest_runtest_setup(self) -> None:
        from ratelimit_sidecar.grpc_server.protocol.connection import Connection

        if getattr(Connection, "recorded", False):
            return
        streams, receive = self.streams, Connection.receive

        def recording(self: Any, data: bytes, now: float) -> Any:
            if not hasattr(self, "_chunks"):
                self._chunks = []
                streams.append(self._chunks)
            if data:
                self._chunks.append(data)
            return receive(self, data, now)

        Connection.receive = recording  # type: ignore[method-assign]
        Connection.recorded = True  # type: ignore[attr-defined]


def seeds(directory: Path) -> None:
    import pytest

    from tests.fuzz.target import HANDSHAKE

    recorder = Recorder()
    tests = ROOT / "tests/unit/grpc_server/protocol"
    pytest.main(["-q", "-p", "no:randomly", "-x", "--no-header", str(tests)], plugins=[recorder])
    directory.mkdir(parents=True, exist_ok=True)
    written = set()
    for chunks in recorder.streams:
        stream = b"".join(chunks)
        inputs = [bytes((0, 0, 0x41)) + stream]  # raw
        if stream.startswith(HANDSHAKE):  # structured: the chunks after the handshake
            ops = bytearray((1, 0))
            rest = stream[len(HANDSHAKE) :]
            for start in range(0, len(rest), MAX_CHUNK):
                chunk = rest[start : start + MAX_CHUNK]
                ops += bytes((0,)) + len(chunk).to_bytes(2, "big") + chunk
                ops += bytes((11,))  # the adapter answers what is held
            inputs.append(bytes(ops))
        for data in inputs:
            if len(data) > MAX_SEED:  # libFuzzer would cut it to -max_len anyway
                continue
            name = hashlib.sha1(data).hexdigest()
            if name not in written:
                written.add(name)
                (directory / name).write_bytes(data)
    print(f"{len(written)} seeds from {len(recorder.streams)} connections in {directory}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--seeds"]:
        seeds(Path(sys.argv[2]))
    else:
        fuzz(sys.argv)

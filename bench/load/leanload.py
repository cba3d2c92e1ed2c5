"""bench/leanload.c as a bench client: built with the C compiler on first use, run as one process
per connection (as h2load runs), its answers' trailers checked here."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from array import array
from pathlib import Path

import hpack

from bench.load.clients import Client, Load, LoadShape, Output, RawResult, frames_file, spawn
from bench.rawload import header_blocks, trailers_error
from bench.workload import Workload
from ratelimit_sidecar._proto import wire

SOURCE = Path(__file__).parents[1] / "leanload.c"
BUILT = Path(__file__).parents[2] / "build" / "bench"  # one binary per version of the source
COMPILER = "cc"
FLAGS = ("-O2", "-std=c11", "-Wall", "-Wextra")


def build() -> Path:
    """The binary of SOURCE as it is now, compiled if it was not yet; raises CalledProcessError
    with the compiler's messages if it does not compile."""
    source = SOURCE.read_bytes()
    binary = BUILT / f"leanload-{hashlib.sha256(source).hexdigest()[:16]}"
    if not binary.exists():
        BUILT.mkdir(parents=True, exist_ok=True)
        partial = binary.with_name(f"{binary.name}.{os.getpid()}.partial")
        command = [COMPILER, *FLAGS, "-o", str(partial), str(SOURCE)]
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
        partial.replace(binary)  # whole or absent, should two runs build it at once
    return binary


class LeanLoad(Client):
    """bench/leanload.c: cycles through all of a workload's bodies as RawLoad does, at a
    fraction of its cost per request (RawLoad's rotation and checks, one process per
    connection): body `offset + c + j * connections` on connection c. Runs against one server
    continue the rotation."""

    name, binary, package = "lean-http2", COMPILER, "gcc"

    def __init__(self) -> None:
        self.offsets: dict[tuple[str, str], int] = {}  # (workload, server) -> next body

    def unavailable(self) -> str | None:
        if shutil.which(COMPILER) is None:
            return f"no C compiler ({COMPILER}; package {self.package}) to build {SOURCE.name}"
        try:
            build()
        except subprocess.CalledProcessError as exc:
            return f"{SOURCE.name} does not compile: {exc.stderr.strip()[-300:]}"
        return None

    def start(
        self, address: str, workload: Workload, shape: LoadShape, workdir: Path, prefix: list[str]
    ) -> Load:
        binary, frames, rotation = build(), frames_file(workload, workdir), (workload.name, address)
        blocks = [workdir / "leanload-first.hpack", workdir / "leanload-later.hpack"]
        for path, block in zip(blocks, header_blocks(wire.METHOD_PATH, address), strict=True):
            path.write_bytes(block)
        offset, host, port = self.offsets.get(rotation, 0), *address.rsplit(":", 1)
        latencies = [workdir / f"leanload-latencies-{c}.bin" for c in range(shape.connections)]
        fixed = [str(frames), *map(str, blocks), str(shape.streams)]
        fixed += [str(shape.settle_s), str(shape.duration_s)]
        argvs = [
            [*prefix, str(binary), host.strip("[]"), port, *fixed,
             str(offset + c), str(shape.connections), str(latency_file)]
            for c, latency_file in enumerate(latencies)
        ]  # fmt: skip

        def read(done: list[Output]) -> RawResult:
            result, fewest = merged(done, latencies)
            if fewest is not None:  # the next run repeats what the others sent beyond it
                next_body = offset + fewest * shape.connections
                self.offsets[rotation] = next_body % len(workload.frames)
            return result

        return spawn(argvs, read)


def merged(done: list[Output], latencies: list[Path]) -> tuple[RawResult, int | None]:
    """The processes' summaries in one result (the answers of each kind of trailers that is not
    grpc-status 0 are errors, not requests), and the fewest requests one process sent."""
    result, decoder, fewest = RawResult(), hpack.Decoder(), None
    for (out, err, failure), latency_file in zip(done, latencies, strict=True):
        if failure or not out.strip():
            result.fail(1, f"leanload {failure or 'printed nothing'}: {err[-300:]}")
            continue
        summary = json.loads(out.strip().splitlines()[-1])
        result.latencies_ms += array("d", latency_file.read_bytes()).tolist()
        sent = int(summary["sent"])
        result.sent, fewest = result.sent + sent, sent if fewest is None else min(fewest, sent)
        result.fail(int(summary["errors"]), str(summary["first_error"]))
        for block, answers in summary["trailers"]:
            if why := trailers_error(decoder, bytes.fromhex(block)):
                result.fail(answers, why)
                result.requests -= answers
    result.requests += len(result.latencies_ms)
    return result, fewest

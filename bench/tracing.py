"""What tracing costs the request path: the sidecar untraced, and with `--tracing` at ratios 0.01
and 1, side by side (hot-10, h2load), exporting to an in-process OTLP receiver.
"""

from __future__ import annotations

from functools import partial

from bench import compare
from bench.load import runs
from bench.load.clients import H2load
from bench.load.servers import start_sidecar
from bench.report import Options, Outcome, conclude
from bench.workload import hot_10
from harness.otlp import OtlpReceiver

ROUNDS = 4
RATIOS = ("0.01", "1")


def run(options: Options) -> Outcome:
    with OtlpReceiver() as receiver, runs.session(options, 60.0, ROUNDS) as bench:
        start = partial(start_sidecar, bench)
        starters = [start] + [
            partial(start, "--tracing", "--tracing-endpoint", receiver.grpc_endpoint,
                    "--tracing-sampling-ratio", ratio, name=f"traced-{ratio}")
            for ratio in RATIOS
        ]  # fmt: skip
        measured = runs.side_by_side(bench, starters, (H2load(),), hot_10(), warm=2.0)
        spans = len(receiver.spans)
    lines, document = compare.report(bench, measured, legend=LEGEND)
    lines.append(f"spans received by the OTLP receiver: {spans:,}")
    document["spans"] = spans
    return conclude(options, lines, document, [])


LEGEND = """\
traced-R = --tracing --tracing-sampling-ratio R (new traces: h2load sends no trace context)."""

"""What every section shares to report: options, outcome, tables, and
bench/results/<section>.json with the machine it ran on.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

RESULTS_DIR = Path(__file__).with_name("results")


@dataclass(frozen=True, slots=True)
class Options:
    results_dir: Path = RESULTS_DIR
    duration_s: float | None = None  # overrides a section's measured seconds per run
    rounds: int | None = None  # overrides a section's number of rounds
    section: str = ""  # the section running (its results file's name), since `started`
    started: float = 0.0


Outcome = bool | None  # a section's: False if a target was measured and missed, None: not judged


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def passing(passed: bool | None) -> str:
    return "NOT MEASURED" if passed is None else "PASS" if passed else "FAIL"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 3) -> str:
    """Columns padded to their widest cell; the first `left` left-aligned, the rest (numbers)
    right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        parts = [c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in pairs]
        return "  ".join(parts).rstrip()

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


def version(argv: Sequence[str]) -> str | None:
    """The first line a tool prints for its version, None if it is not installed."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else None


def machine() -> dict[str, Any]:
    with open("/proc/cpuinfo", encoding="utf-8") as info:
        models = [ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")]
    return {
        "cpus": os.cpu_count(), "cpu_model": models[0] if models else None,
        "kernel": platform.release(), "python": platform.python_version(),
        "grpcio": grpc.__version__, **{tool: version([tool, flag]) for tool, flag in TOOL_VERSIONS},
    }  # fmt: skip


TOOL_VERSIONS = (("h2load", "--version"), ("wrk", "-v"))


def _clean(value: Any) -> Any:
    """NaN is not JSON: null instead."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def conclude(
    options: Options,
    lines: Sequence[str],
    document: dict[str, Any],
    verdicts: Sequence[bool | None] = (),
) -> Outcome:
    """Print the section's report and time, write `<section>.json` in the results directory
    (the document, the report, when and where it ran); the target is met when every judged
    verdict (not None) passed."""
    text, section = "\n".join(lines), options.section
    print(f"{text}\nsection time: {time.monotonic() - options.started:.0f} s")
    options.results_dir.mkdir(parents=True, exist_ok=True)
    path = options.results_dir / f"{section}.json"
    header = {"section": section, "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    full = {**header, "machine": machine(), **document, "report": text}
    path.write_text(json.dumps(_clean(full), indent=2, default=str) + "\n")
    print(f"results: {path}")
    judged = [v for v in verdicts if v is not None]
    return all(judged) if judged else None

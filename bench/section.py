"""A benchmark section: one self-contained measurement with its own report and results file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Options:
    results_dir: Path
    duration_s: float | None = None  # override a section's measurement length (None: its own)
    rounds: int | None = None  # override a section's number of rounds (None: its own)


@dataclass(frozen=True, slots=True)
class Outcome:
    """`met` is False when a target was measured and missed; None when nothing was judged."""

    met: bool | None
    results_file: Path | None = None


@dataclass(frozen=True, slots=True)
class Section:
    name: str
    description: str
    run: Callable[[Options], Outcome]

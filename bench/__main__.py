"""`python -m bench [section ...]` (what `make bench` runs): every section by default.

A section is a module with a `run(Options) -> Outcome` function, registered in SECTIONS below;
add later benchmarks (Redis sync costs, Envoy end to end, a `limits` baseline) the same way.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from bench import baseline, envoy_e2e, overhead, redis_sync, workers
from bench.report import RESULTS_DIR
from bench.section import Options, Outcome, Section

SECTIONS: dict[str, Section] = {
    section.name: section
    for section in (
        Section(
            overhead.NAME,
            "issue #2: sidecar vs an empty grpc.aio handler, hot-10 and distinct-100k keys",
            overhead.run,
        ),
        Section(
            redis_sync.NAME,
            "issue #3: Redis round trips, commands and sync time per span; memory per key",
            redis_sync.run,
        ),
        Section(
            baseline.NAME,
            "issue #3: sidecar vs a per-request-Redis `limits` service; Redis hung and down",
            baseline.run,
        ),
        Section(
            envoy_e2e.NAME, "issue #4: wrk -> Envoy -> sidecar vs empty service", envoy_e2e.run
        ),
        Section(workers.NAME, "issue #5: --workers 1 vs 2; metrics cost", workers.run),
    )
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("sections", nargs="*", metavar="section", help="default: all")
    parser.add_argument("--list", action="store_true", help="list the sections and exit")
    parser.add_argument("--duration", type=float, help="seconds measured per run (override)")
    parser.add_argument("--rounds", type=int, help="alternating rounds per workload (override)")
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 when a measured target is missed"
    )
    return parser


def run_section(section: Section, options: Options) -> Outcome:
    """Run one section; a section pins this process to its load CPU, so give the next one back
    every CPU (else it would find a single usable CPU and measure unpinned)."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        return section.run(options)
    finally:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        for section in SECTIONS.values():
            print(f"{section.name:<12} {section.description}")
        return 0
    unknown = [name for name in args.sections if name not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s): {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    options = Options(RESULTS_DIR, args.duration, args.rounds)
    missed = []
    for name in args.sections or list(SECTIONS):
        outcome = run_section(SECTIONS[name], options)
        if outcome.met is False:
            missed.append(name)
    if missed:
        print(f"target missed in: {', '.join(missed)}")
    return 1 if missed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())

"""`python -m bench [section ...]` (what `make bench` runs): every section by default.

A section is listed in SECTIONS and run by `run(Options) -> Outcome` of its module, named after
it (`bench/per_request_redis.py` for per-request-redis); each prints its tables and writes
`bench/results/<section>.json`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

from bench.report import Options

SECTIONS = {  # section: what it measures
    "overhead": "sidecar vs empty handlers (fast, grpcio) under load: hot-10, distinct-100k",
    "algorithms": "each algorithm's eventual rules vs the empty handler: hot-10, distinct-100k",
    "redis-sync": "Redis round trips, commands and sync time per span; memory per key",
    "per-request-redis": "sidecar vs a service calling Redis per request; Redis hung and down",
    "strict": "strict rules of each algorithm vs the per-request-Redis `limits` service",
    "envoy": "wrk -> Envoy -> sidecar vs empty service and plain Envoy; CPU per request",
    "latency": "p99 of a decision at half the saturation rate, per transport",
    "abuse": "honest p99 on the fast transport while one connection abuses it",
    "memory": "resident memory idle and with 100,000 keys, per transport",
    "rlqs": "wrk -> Envoy: no filter, RLQS (ALLOW_ALL; sidecar), ShouldRateLimit, at once",
    "workers": "sidecar --workers 1 vs 2 under load; metrics cost per request",
    "edge": "keys at the edge on 3 sidecars: admitted per window, store work, switch, outage",
    "edge-trailing": "sliding windows and token buckets at the edge on 3 sidecars vs exact",
    "flood": "a flood of fresh values cannot reset heavy clients' counters",
    "overrides": "overrides: propagation p50/p99 over 3 nodes; 10,000 loaded vs none",
    "xds": "xDS rules: push -> 3 nodes, p50/p99; reconnect attempts while down",
    "tracing": "the request path's cost untraced and traced at 0.01 and 1",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("sections", nargs="*", metavar="section", help="default: all")
    parser.add_argument("--list", action="store_true", help="list the sections and exit")
    parser.add_argument("--duration", type=float, help="seconds measured per run (override)")
    parser.add_argument("--rounds", type=int, help="alternating rounds per workload (override)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if args.list:
        for name, description in SECTIONS.items():
            print(f"{name:<18} {description}")
        return 0
    names = [name.replace("_", "-") for name in args.sections] or list(SECTIONS)
    unknown = [name for name in names if name not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s): {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    options = Options(duration_s=args.duration, rounds=args.rounds)
    cpus = os.sched_getaffinity(0)
    missed = []
    for name in names:
        print(f"[{name}] {SECTIONS[name]}")
        section = importlib.import_module(f"bench.{name.replace('-', '_')}")
        try:
            outcome = section.run(replace(options, section=name, started=time.monotonic()))
        finally:  # a section pins this process: give the next one every CPU back
            os.sched_setaffinity(0, cpus)
        if outcome is False:
            missed.append(name)
    if missed:
        print(f"target missed in: {', '.join(missed)}")
    return 1 if missed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())

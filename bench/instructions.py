"""Instructions per decision, counted by valgrind's callgrind: a measure of the request path that
other load does not move, for comparing two source trees where wall-clock runs are too noisy.

    python bench/instructions.py --tree before=/path/to/old/tree --tree after=.

Per tree and case, `DRIVER` runs under callgrind with that tree first on PYTHONPATH: the set-up,
then `DECISIONS` decisions through `RateLimitServicer.answer` (what the fast transport calls) in
`deque(map(answer, bodies), maxlen=0)`. Callgrind collects only inside that deque's
`consume_iterator`, so the count is the decisions' alone (not the start, imports or set-up,
which move by millions with where memory lands). With PYTHONHASHSEED fixed and a fake clock from
a fixed instant, a count repeats to within a few instructions per decision.

Cases: `hot` (10 keys, admitted), `blocked` (one key refused under its block), `distinct` (every
request new: parse, match, a new counter), `seen` (those requests each decided once before: the
steady state of `bench overhead`'s distinct-100k); `hot-10k`, `blocked-10k`, `distinct-10k` with
10,000 runtime overrides loaded (half the distinct requests meet one) and `penalised` (a blocked
key of a rule with a penalty), only on a tree that has overrides; `hot-fleet`, `blocked-fleet`:
the limiter of a node with Redis (`FleetLimiter`, no sync loop).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

DECISIONS = 10_000  # per run
LOOP = "consume_iterator"  # CPython's deque(iterable, maxlen=0) loop: callgrind counts inside it
HOT_KEYS = 10
LOADED = 10_000
START_MS = 1_800_000_000_000  # the fake clock's fixed start: runs repeat exactly
STEP_MS = 0.1  # 10,000 decisions per second of the fake clock
BASE_CASES = ("hot", "blocked", "distinct", "seen")
LOADED_CASES = ("hot-10k", "blocked-10k", "distinct-10k", "penalised")
FLEET_CASES = ("hot-fleet", "blocked-fleet")  # the limiter of a node with Redis, no sync loop
# The handler's path cut after each stage (cumulative), on the hot case: what each one adds.
STAGES = ("call", "lookup", "decision", "encoding", "handler")
STAGE_CASES = tuple(f"hot/{stage}" for stage in STAGES)
# The fast transport's frame loop fed reads of frameloop.CALLS_PER_READ calls, answered by a
# prebuilt answer (`empty-fast`) or by the sidecar's servicer on the hot or seen case
# (`hot-fast`, `seen-fast`): instructions per call.
TRANSPORT_CASES = ("empty-fast", "hot-fast", "seen-fast")
PENALTY = "penalty: {factor: 2, max: 1h, forgive_after: 1h}"
DRIVER = Path(__file__).resolve()
OVERRIDES_MODULE = "ratelimit_sidecar/overrides/applied.py"  # a tree that has the `-10k` cases
TOTALS = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)

Counts = Mapping[tuple[str, str], float]  # (tree, case) -> instructions per decision


class FixedClock:
    """Starts at START_MS and advances STEP_MS per read."""

    def __init__(self) -> None:
        self.now = float(START_MS)

    def __call__(self) -> int:
        self.now += STEP_MS
        return int(self.now)


def bodies(case: str, decisions: int) -> list[bytes]:
    """The request bodies decided, in order."""
    from bench.workload import key_values, request

    if _base(case) in ("distinct", "seen"):
        values = key_values(100_000)[:decisions]
    elif _base(case) in ("hot", "empty"):
        values = [key_values(HOT_KEYS)[i % HOT_KEYS] for i in range(decisions)]
    else:
        values = ["blocked"] * decisions
    return [request(value).SerializeToString() for value in values]


def _base(case: str) -> str:
    """The case without its `-10k`, `-fleet`, `-fast` or stage."""
    base = case.partition("/")[0]
    return base.removesuffix("-10k").removesuffix("-fleet").removesuffix("-fast")


def overridden_values() -> list[str]:
    """The hot keys and every other distinct value: LOADED in all (the blocked key meets none)."""
    from bench.workload import key_values

    distinct = key_values(100_000)[HOT_KEYS : HOT_KEYS + 2 * LOADED : 2]
    return [*key_values(HOT_KEYS), *distinct][:LOADED]


def make_handler(case: str) -> Any:
    """The handler for `case`, warmed up: blocked keys already blocked."""
    from bench.workload import bench_rules, rules_yaml
    from ratelimit_sidecar.core import FleetLimiter, LocalLimiter
    from ratelimit_sidecar.metrics import Metrics
    from ratelimit_sidecar.service.ratelimit import RateLimitHandler

    blocking = _base(case) in ("blocked", "penalised")
    extra = PENALTY if case == "penalised" else ""
    text = rules_yaml(1, extra) if blocking else rules_yaml()
    rules = bench_rules(text.replace("unit: second", "unit: hour") if blocking else text)
    keys = 2 * DECISIONS
    limiter = (FleetLimiter if case.endswith("-fleet") else LocalLimiter)(keys)
    decider = RateLimitHandler(rules, limiter, FixedClock(), observer=Metrics(), cache_entries=keys)
    if case.endswith("-10k"):
        from bench.overrides import applied_overrides

        decider.swap_overrides(applied_overrides(overridden_values()))
    warm_up = {"distinct": 0, "seen": DECISIONS}.get(_base(case), 20)
    answer = answerer(decider)
    for body in bodies(case, warm_up):  # not in `deque(map(...))`: callgrind counts only there
        answer(body)
    return decider


def answerer(handler: Any) -> Callable[[bytes], Any]:
    """What the fast transport calls: `RateLimitServicer.answer` (the decision histogram's
    timing included); on a tree from before the fast transport, `decide`."""
    from ratelimit_sidecar.grpc_server.rls import RateLimitServicer

    observer = getattr(handler, "_observer", None)
    servicer = RateLimitServicer(handler, observer and observer.decision_seconds.observe)
    return getattr(servicer, "answer", None) or handler.decide  # type: ignore[no-any-return]


def _frameloop() -> Any:
    """bench/frameloop.py beside this file, whichever tree is measured (older ones lack it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("frameloop", DRIVER.with_name("frameloop.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def drive(case: str, decisions: int) -> None:
    """What runs under callgrind: the set-up, then `decisions` decisions."""
    import gc

    import ratelimit_sidecar

    try:
        from ratelimit_sidecar._proto import wire
    except ImportError:  # a tree from before wire.py joined the generated code
        from ratelimit_sidecar import wire  # type: ignore[attr-defined,no-redef]

    if not Path(ratelimit_sidecar.__file__).resolve().is_relative_to(Path.cwd().resolve()):
        raise SystemExit(f"{ratelimit_sidecar.__file__} is not from the tree in {Path.cwd()}")
    handler, requests = make_handler(case), bodies(case, decisions)
    answer = answerer(handler)
    if case in TRANSPORT_CASES:
        empty = wire.RateLimitResponse(overall_code=wire.Code.OK).SerializeToString()
        answer = (lambda _body: empty) if case == "empty-fast" else answer
        _frameloop().frame_loop(answer, requests)  # counts its own loop of reads
        return
    if "/" in case:
        answer = _frameloop().stages(handler)[case.split("/")[1]]
    gc.collect()
    gc.freeze()  # as the server does after start-up
    deque(map(answer, requests), maxlen=0)  # what callgrind counts
    last = answer(requests[-1])
    code = wire.RateLimitResponse.FromString(last).overall_code if isinstance(last, bytes) else None
    refused = _base(case) in ("blocked", "penalised")
    expected = wire.Code.OVER_LIMIT if refused else wire.Code.OK
    if code != expected and case.partition("/")[2] in ("", "handler"):  # a whole answer
        raise SystemExit(f"{case}: the last answer was code {code}, expected {expected}")


def count(python: str, tree: Path, case: str, decisions: int, out: Path) -> int:
    """Instructions of one driver run's decisions, under callgrind."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    command += ["--collect-atstart=no", f"--toggle-collect={LOOP}"]
    command += [python, str(DRIVER), "drive", case, str(decisions)]
    subprocess.run(command, env=env, check=True, capture_output=True, cwd=tree)
    return totals(out.read_text())


def totals(callgrind_out: str) -> int:
    """The instructions counted in a callgrind output file's text."""
    found = TOTALS.search(callgrind_out)
    if found is None:
        raise ValueError("no summary or totals line in the callgrind output")
    return int(found.group(1))


def rows(counts: Counts, trees: Sequence[str], cases: Sequence[str]) -> list[list[str]]:
    """One row per case: instructions per decision per tree, and each tree against the first."""
    table = []
    for case in cases:
        cells = [counts.get((tree, case)) for tree in trees]
        first = cells[0]
        shown = [f"{c:,.0f}" if c is not None else "-" for c in cells]
        ratios = [f"{c / first:.3f}" if c is not None and first else "-" for c in cells[1:]]
        table.append([case, *shown, *ratios])
    return table


def render(counts: Counts, trees: Sequence[str], cases: Sequence[str]) -> str:
    first, others = trees[0], trees[1:]
    header = ["case", *(f"{t} instr/decision" for t in trees), *(f"{t}/{first}" for t in others)]
    lines = [header, *rows(counts, trees, cases)]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def measure(python: str, trees: Mapping[str, Path], cases: Sequence[str], keep: Path) -> Counts:
    counts: dict[tuple[str, str], float] = {}
    for case in cases:
        for name, tree in trees.items():
            if case in LOADED_CASES and not (tree / OVERRIDES_MODULE).exists():
                continue
            out = keep / f"{name}.{case.replace('/', '-')}.out"
            counts[name, case] = count(python, tree, case, DECISIONS, out) / DECISIONS
            print(f"{name} {case}: {counts[name, case]:,.0f} instructions per decision", flush=True)
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["drive"]:
        if sys.path and Path(sys.path[0]).resolve() == DRIVER.parent:
            del sys.path[0]  # bench/'s modules are imported as `bench.*`, from PYTHONPATH's tree
        drive(args[1], int(args[2]))
        return 0
    parser = argparse.ArgumentParser(prog="python bench/instructions.py", description=__doc__)
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH")
    choices = BASE_CASES + LOADED_CASES + FLEET_CASES + STAGE_CASES + TRANSPORT_CASES
    parser.add_argument("--case", action="append", choices=choices)
    parser.add_argument("--keep", type=Path, help="directory for callgrind's output files")
    options = parser.parse_args(args)
    trees = {n: Path(p).resolve() for n, p in (t.split("=", 1) for t in options.tree)}
    cases = options.case or [*BASE_CASES, *FLEET_CASES, *LOADED_CASES]
    keep = options.keep or Path(tempfile.mkdtemp(prefix="rls-callgrind-"))
    keep.mkdir(parents=True, exist_ok=True)
    counts = measure(sys.executable, trees, cases, keep)
    print(f"\n{render(counts, list(trees), cases)}\ncallgrind files: {keep}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

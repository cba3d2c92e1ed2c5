"""Runtime overrides (issue #15): how fast a change reaches every node, and what a large set costs
the request path.

- propagation: three sidecars on one Redis; `CHANGES` PUTs, each on the next node in turn, timed
  until each other node shows the new version in /debug/rules (polled: an upper bound with the
  PUT's round trip), beside each node's `overrides_propagation_seconds`. Target: p99 under 1 s.
- overhead: `bench overhead`'s load against a sidecar without overrides and one with `LOADED`
  (a `--state-dir` file, no Redis) covering every hot-10 value and the first distinct-100k ones,
  so requests both meet and miss them. Target: ratio at least `TARGET_RATIO` (bench.compare).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from bench import compare, overhead
from bench.load import runs
from bench.load.clients import percentile
from bench.load.servers import samples, start_sidecar
from bench.overhead import each_plan, plans
from bench.report import Options, Outcome, conclude, fmt, passing, table
from bench.workload import DOMAIN, KEY, UNREACHABLE, key_values
from harness.override_fleet import RULES, OverrideNode
from harness.redis_servers import server_group
from harness.rules import write_rules
from ratelimit_sidecar.overrides.applied import AppliedOverrides
from ratelimit_sidecar.overrides.file_store import FILE_NAME, FORMAT
from ratelimit_sidecar.overrides.model import Override, OverrideBounds, parse_override

CHANGES = 200
NODES = 3
VALUES = 50  # distinct overridden values the changes cycle through
GAP_S = 0.02  # between changes
WAIT_S = 5.0  # a node that has not applied a change by then counts as missed
POLL_S = 0.002
LOADED = 10_000
ROUNDS = 4
TARGET_P99_S = 1.0
TARGET_RATIO = 0.90


@dataclass(frozen=True, slots=True)
class Propagation:
    lags_s: Mapping[str, Sequence[float]]  # receiving node -> seconds per change it applied
    missed: int  # (change, node) pairs not applied within WAIT_S
    put_s: Sequence[float]  # the PUTs' own round trips
    histogram: Mapping[str, tuple[float, float]]  # node -> (count, sum) of its lag histogram

    @property
    def every(self) -> list[float]:
        return sorted(lag for lags in self.lags_s.values() for lag in lags)


def ms(values: Sequence[float], q: float) -> str:
    """The `q` percentile of `values` (seconds) in ms, nearest rank; "-" without values."""
    return fmt(1000 * percentile(sorted(values), q), 1)


def propagation_rows(result: Propagation) -> list[list[str]]:
    """One row per receiving node and one for all: changes, p50, p99, max (ms), and the mean of
    the nodes' own lag histograms."""
    rows = []
    for name, lags in [*sorted(result.lags_s.items()), ("all", result.every)]:
        histogram = result.histogram if name == "all" else {name: result.histogram.get(name)}
        cells = [ms(lags, q) for q in (50, 99, 100)]
        rows.append([name, str(len(lags)), *cells, _mean_ms(histogram)])
    return rows


def propagation_table(result: Propagation) -> list[str]:
    header = ["node", "changes", "p50 ms", "p99 ms", "max ms", "histogram mean ms"]
    return [
        table(header, propagation_rows(result), left=1),
        f"PUT round trip p50 {ms(result.put_s, 50)} ms; "
        f"missed (not applied within {WAIT_S:.0f} s): {result.missed}; "
        f"p99 {ms(result.every, 99)} ms, target < {TARGET_P99_S * 1000:.0f} ms: "
        f"{passing(propagation_met(result))}",
    ]


def propagation_met(result: Propagation) -> bool:
    return result.missed == 0 and percentile(result.every, 99) < TARGET_P99_S  # NaN: none


def _mean_ms(histogram: Mapping[str, tuple[float, float] | None]) -> str:
    pairs = [pair for pair in histogram.values() if pair is not None]
    count = sum(c for c, _ in pairs)
    return f"{1000 * sum(s for _, s in pairs) / count:.1f}" if count else "-"


def measure_propagation(changes: int = CHANGES) -> Propagation:
    with (
        tempfile.TemporaryDirectory(prefix="rls-bench-ovr-") as tmp,
        server_group(Path(tmp) / "redis") as group,
    ):
        redis = group.standalone()
        rules = write_rules(Path(tmp), RULES)
        nodes = [OverrideNode(rules, redis.url, f"n{i}") for i in range(NODES)]
        try:
            for node in nodes:
                node.start()
            return _changes(nodes, changes)
        finally:
            for node in nodes:
                node.stop()


def _changes(nodes: Sequence[OverrideNode], changes: int) -> Propagation:
    lags: dict[str, list[float]] = {f"n{i}": [] for i in range(len(nodes))}
    put_s, missed = [], 0
    for n in range(changes):
        writer = n % len(nodes)
        sent = time.monotonic()
        code, answer = nodes[writer].put(f"bench{n % VALUES}", 100 + n)
        put_s.append(time.monotonic() - sent)
        if code != 200:
            raise RuntimeError(f"PUT answered {code}: {answer}")
        version = answer["version"]
        assert isinstance(version, int)
        pending = {i for i in range(len(nodes)) if i != writer}
        while pending and time.monotonic() - sent < WAIT_S:
            for i in sorted(pending):
                if nodes[i].version() >= version:
                    lags[f"n{i}"].append(time.monotonic() - sent)
                    pending.discard(i)
            time.sleep(POLL_S)
        missed += len(pending)
        time.sleep(GAP_S)
    histogram = {f"n{i}": _histogram(node.metrics()) for i, node in enumerate(nodes)}
    return Propagation(lags, missed, put_s, histogram)


def _histogram(metrics: str) -> tuple[float, float]:
    """(count, sum) of `overrides_propagation_seconds` in a /metrics page."""
    found = samples(metrics.splitlines(), "ratelimit_sidecar_overrides_propagation_seconds_")
    return found.get("count", 0.0), found.get("sum", 0.0)


def overrides(values: Sequence[str]) -> list[Override]:
    """One override per value at the bench rule's limit, as the admin API parses it."""
    limit = {"unit": "second", "requests_per_unit": UNREACHABLE}
    bodies = [{"domain": DOMAIN, "descriptor": [{"key": KEY, "value": v}]} for v in values]
    return [parse_override({**body, "rate_limit": limit}, OverrideBounds()) for body in bodies]


def write_state(directory: Path, values: Sequence[str]) -> Path:
    """A `--state-dir` whose override file holds `values`' overrides as the file store keeps
    them: loaded at start, no history."""
    directory.mkdir(parents=True, exist_ok=True)
    documents = {str(o.document["id"]): dict(o.document) for o in overrides(values)}
    state = {"format": FORMAT, "version": 1, "documents": documents, "changes": []}
    (directory / FILE_NAME).write_text(json.dumps(state))
    return directory


def loaded_values() -> list[str]:
    """hot-10's values and the first distinct-100k values: `LOADED` in all."""
    hot = key_values(10)
    return hot + key_values(100_000)[: LOADED - len(hot)]


def applied_overrides(values: Sequence[str], version: int = 1) -> AppliedOverrides:
    """`values`' overrides as the keeper hands them to the request path."""
    return AppliedOverrides.of(overrides(values), version)


def run(options: Options) -> Outcome:
    print(f"  propagation over {CHANGES} changes across {NODES} nodes")
    propagation = measure_propagation()
    lines = propagation_table(propagation)
    print("\n".join(lines))
    print(f"  request path under load with {LOADED:,} overrides loaded vs none")
    with runs.session(options, overhead.RETRY_BUDGET_S, ROUNDS) as bench:
        state = write_state(bench.workdir / "state", loaded_values())
        start = partial(start_sidecar, bench, "--max-keys", str(overhead.MAX_KEYS))
        loaded = partial(start, "--state-dir", str(state), name="with-10k")
        measured = each_plan(bench, plans(full=False), [start, loaded])
    found = compare.against(measured, "sidecar", ["with-10k"], target=TARGET_RATIO, by_cpu=True)
    load_lines, document = compare.report(bench, measured, found)
    lines += load_lines
    document["propagation"] = asdict(propagation)
    verdicts = [propagation_met(propagation), *compare.verdicts(found)]
    return conclude(options, lines, document, verdicts)

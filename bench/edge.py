"""Keys at the edge (`consistency: edge`, the default) on real processes: three sidecars share
one Redis; a client sends ShouldRateLimit round robin over them at a set rate. Windows are the
wall clock's, which is Redis's on this machine.

- hot: one key offered at 2x and 10x its limit (240 per 10 s, 6 spans) over WINDOWS whole
  windows, with `--default-consistency eventual` (the mode before) and the default, beside a
  `consistency: strict` rule (the store decides every request). Admitted per window, and the
  store work for the key: keys the syncs carried (`sync_keys_pushed` + `sync_keys_read` over
  the three nodes; strict: its checks) per request. Targets: worst window <= MAX x 1.02 at 2x
  and x 1.05 at 10x; store work <= 0.2 and <= 0.1 per request.
- switch: the spread between the first and the last node showing the key at the edge
  (`edge_keys`, each node's /metrics polled every POLL_S) at 2x. Target: <= 50 ms.
- under half: one key at 0.4x of 12,000 per 10 s, in both modes, alternating rounds. Target:
  <= 0.01 store work per request at the edge (the client's p99 is shown, too noisy to judge).
- decision cost away from the edge: `FleetLimiter.hit` in-process, eventual and edge rules in
  alternating rounds. Target: edge within 5 % of eventual.
- fresh: FRESH new values, each seen once. Target: <= 0.05 per request.
- tiny: a new key of 3 a minute; one request on each gateway at once, then one more on each
  30 ms later. Target: 3 admitted.
- store killed at the edge: Redis killed mid-window at 2x for OUTAGE_S, then restarted: every
  request answered without error, none slower than `--strict-timeout-ms`; the window after
  Redis is back held to the 2x bound.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from bench.load.servers import samples
from bench.report import Options, Outcome, conclude, fmt, passing, table
from bench.workload import request, rules_dir
from harness.grpc_client import rls_stub
from harness.redis_servers import ServerProcess, server_group
from harness.sidecar import SidecarProcess
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.config.model import AlgorithmName, RateLimit, Rule, Unit
from ratelimit_sidecar.core import FleetLimiter, Hit, PushResult, SyncResult

NODES, LIMIT, WINDOW_S, WINDOWS = 3, 240, 10, 3
BOUNDS = {2: 1.02, 10: 1.05}  # load -> worst window / MAX
STORE_TARGETS = {2: 0.2, 10: 0.1}  # load -> store work per request
UNDER_LIMIT, UNDER_LOAD, UNDER_TARGET, UNDER_ROUNDS = 12_000, 0.4, 0.01, 3
COST_ROUNDS, COST_CALLS = 9, 200_000
FRESH, FRESH_TARGET = 300_000, 0.05
SWITCH_TARGET_MS, POLL_S = 50.0, 0.002
LATENCY_RATIO = 1.05  # p99 of a key away from the edge, edge / eventual
OUTAGE_S, STRICT_TIMEOUT_MS = 3.0, 50
DOMAIN = "edge"
RULES = f"""domain: {DOMAIN}
descriptors:
  - key: hot
    rate_limit: {{unit: second, unit_multiplier: {WINDOW_S}, requests_per_unit: {LIMIT}}}
  - key: exact
    rate_limit: {{unit: second, unit_multiplier: {WINDOW_S}, requests_per_unit: {LIMIT},
                  consistency: strict}}
  - key: under
    rate_limit: {{unit: second, unit_multiplier: {WINDOW_S}, requests_per_unit: {UNDER_LIMIT}}}
  - key: fresh
    rate_limit: {{unit: minute, requests_per_unit: 60}}
  - key: tiny
    rate_limit: {{unit: minute, requests_per_unit: 3}}
"""
MODES = {"eventual (before)": ("--default-consistency", "eventual"), "edge": ()}
STORE_METRICS = ("sync_keys_pushed_total", "sync_keys_read_total", "strict_checks_total")


@dataclass
class Sent:
    """What a run's client saw: admitted per window, answers' time, errors."""

    admitted: dict[int, int] = field(default_factory=dict)
    arrivals: list[tuple[int, bool]] = field(default_factory=list)  # (wall ms, admitted)
    requests: int = 0
    errors: int = 0
    slowest_ms: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)

    def p99_ms(self) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


class Fleet:
    """Three sidecars on one Redis; a client channel to each."""

    def __init__(self, nodes: Sequence[SidecarProcess]) -> None:
        self.nodes = nodes
        self.channels = [grpc.insecure_channel(node.address) for node in nodes]
        self.stubs = [rls_stub(channel) for channel in self.channels]

    def ask(self, node: int, key: str, value: str) -> bool | None:
        """One request; OK or not, None on an error."""
        message = request(value, DOMAIN, key)
        try:
            reply = self.stubs[node].ShouldRateLimit(message, timeout=2)
        except grpc.RpcError:
            return None
        return bool(reply.overall_code == wire.Code.OK)

    def store_work(self) -> float:
        """Keys carried by store calls so far, over the nodes."""
        total = 0.0
        for node in self.nodes:
            found = metrics(node)
            total += sum(v for k, v in found.items() if k.startswith(STORE_METRICS))
        return total

    def close(self) -> None:
        for channel in self.channels:
            channel.close()


def metrics(node: SidecarProcess) -> dict[str, float]:
    url = f"http://127.0.0.1:{node.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    return samples(lines, "ratelimit_sidecar_")


@contextmanager
def fleet(
    workdir: Path, store: ServerProcess, *flags: str, rules_text: str = RULES
) -> Iterator[Fleet]:
    with store.client() as admin:
        admin.flushall()
    rules = rules_dir(workdir, rules_text, DOMAIN)
    extra = ("--redis-url", store.url, "--strict-timeout-ms", str(STRICT_TIMEOUT_MS), *flags)
    nodes = [SidecarProcess(rules, *extra, "--node-id", f"n{i}") for i in range(NODES)]
    try:
        ready = Fleet([node.wait_ready() for node in nodes])
        time.sleep(1.5)  # the heartbeats: every node counts three
        yield ready
        ready.close()
    finally:
        for node in nodes:
            node.stop()


def next_window_start(after_s: float = 0.0) -> float:
    now = time.time() + after_s
    return (now // WINDOW_S + 1) * WINDOW_S


def paced(
    clients: Fleet,
    key: str,
    value: str,
    rate: float,
    until: float,
    *,
    between: Callable[[], None] = lambda: None,
) -> Sent:
    """Round robin at `rate` per second from now until `until` (wall clock)."""
    sent, n, start = Sent(), 0, time.monotonic()
    while time.time() < until:
        due = start + n / rate
        time.sleep(max(0.0, due - time.monotonic()))
        began = time.monotonic()
        window = int(time.time() // WINDOW_S)
        ok = clients.ask(n % NODES, key, value)
        took_ms = 1000 * (time.monotonic() - began)
        sent.slowest_ms = max(sent.slowest_ms, took_ms)
        sent.latencies_ms.append(took_ms)
        sent.requests += 1
        sent.errors += ok is None
        sent.admitted[window] = sent.admitted.get(window, 0) + bool(ok)
        sent.arrivals.append((int(1000 * time.time()), bool(ok)))
        n += 1
        between()
    return sent


@dataclass(frozen=True, slots=True)
class HotRun:
    mode: str
    load: int
    per_window: list[int]
    store_per_request: float

    @property
    def worst(self) -> int:
        return max(self.per_window, default=0)

    def met(self) -> bool:
        held = self.worst <= LIMIT * BOUNDS[self.load]
        return held and self.store_per_request <= STORE_TARGETS[self.load]


def hot_run(clients: Fleet, mode: str, key: str, load: int) -> HotRun:
    start = next_window_start(0.2)
    time.sleep(max(0.0, start - time.time()))
    before = clients.store_work()
    sent = paced(clients, key, "v", load * LIMIT / WINDOW_S, start + WINDOWS * WINDOW_S)
    time.sleep(0.5)  # the last pushes
    work = (clients.store_work() - before) / max(1, sent.requests)
    windows = sorted(sent.admitted)[:WINDOWS]
    return HotRun(mode, load, [sent.admitted[w] for w in windows], work)


def switch_spread_ms(clients: Fleet) -> list[float]:
    """Per window at 2x: first to last node entering the edge, from polled `edge_keys`."""
    entered: list[dict[int, float]] = [{} for _ in clients.nodes]
    stop = threading.Event()

    def poll(index: int) -> None:
        node = clients.nodes[index]
        while not stop.is_set():
            window = int(time.time() // WINDOW_S)
            if metrics(node).get("edge_keys", 0) and window not in entered[index]:
                entered[index][window] = time.monotonic()
            time.sleep(POLL_S)

    pollers = [threading.Thread(target=poll, args=(i,)) for i in range(NODES)]
    for poller in pollers:
        poller.start()
    try:
        hot_run(clients, "edge", "hot", 2)
    finally:
        stop.set()
        for poller in pollers:
            poller.join(timeout=10)
    windows = set.intersection(*(set(seen) for seen in entered))
    return [
        1000 * (max(e[w] for e in entered) - min(e[w] for e in entered)) for w in sorted(windows)
    ]


def under_half(clients: Fleet) -> tuple[float, float]:
    """(store work per request, p99 ms of the client's round trips) of a key at UNDER_LOAD."""
    start = next_window_start(0.2)
    time.sleep(max(0.0, start - time.time()))
    before = clients.store_work()
    rate = UNDER_LOAD * UNDER_LIMIT / WINDOW_S
    sent = paced(clients, "under", "v", rate, start + 2 * WINDOW_S)
    time.sleep(0.5)
    return (clients.store_work() - before) / max(1, sent.requests), sent.p99_ms()


def decision_cost(
    rounds: int = COST_ROUNDS,
    calls: int = COST_CALLS,
    algorithm: AlgorithmName = AlgorithmName.FIXED_WINDOW,
) -> dict[str, list[float]]:
    """ns per `FleetLimiter.hit` of 100 keys far from their limit (a billion per 10 s) on a
    limiter that knows 3 live nodes, eventual and edge in alternating rounds: the request
    path's only change."""
    rules = {
        mode: Rule(
            DOMAIN,
            (("far", ""),),
            RateLimit(10**9, Unit.SECOND, WINDOW_S, algorithm=algorithm, edge=edge),
        )
        for mode, edge in (("eventual (before)", False), ("edge", True))
    }
    found: dict[str, list[float]] = {mode: [] for mode in rules}
    for _ in range(rounds):
        for mode, rule in rules.items():
            limiter = FleetLimiter(key_digest="|".join)
            now = int(time.time() * 1000)
            limiter.apply_sync(now, limiter.end_span(now), SyncResult(live_nodes=NODES))
            hits = [[Hit(rule, (DOMAIN, "far", f"v{i}"), 1)] for i in range(100)]
            synced(limiter, now, hits)
            started = time.perf_counter()
            for n in range(calls):
                limiter.hit(now, hits[n % 100])
            found[mode].append(1e9 * (time.perf_counter() - started) / calls)
    return found


def synced(limiter: FleetLimiter, now: int, hits: Sequence[Sequence[Hit]]) -> None:
    """Each key counted and pushed once, as a key away from the edge has been."""
    for one in hits:
        limiter.hit(now, one)
    batch = limiter.end_span(now, flush=True)
    answers = tuple(PushResult(0, 0) for _ in batch.pushes)
    limiter.apply_sync(now, batch, SyncResult(answers, (0,) * len(batch.total_reads), NODES))


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fresh_keys(clients: Fleet, count: int = FRESH) -> float:
    before = clients.store_work()
    for n in range(count):
        clients.ask(n % NODES, "fresh", f"f{n}")
    time.sleep(WINDOW_S + 1.0)  # the span syncs after them
    return (clients.store_work() - before) / count


def tiny_limit(clients: Fleet, key: str = "tiny") -> int:
    """3 a minute: one request on each gateway at once, then one more on each 30 ms later."""
    answers: list[bool | None] = []

    def on(node: int) -> None:
        answers.append(clients.ask(node, key, "new"))  # one append: no lost update

    for _ in range(2):
        threads = [threading.Thread(target=on, args=(node,)) for node in range(NODES)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=5)
        time.sleep(0.03)
    return sum(bool(answer) for answer in answers)


def store_killed(clients: Fleet, store: ServerProcess) -> tuple[Sent, list[int]]:
    """2x on a fresh key; Redis killed once the key is at the edge, restarted OUTAGE_S later."""
    start = next_window_start(0.2)
    time.sleep(max(0.0, start - time.time()))
    kill_at, back_at = start + 0.6 * WINDOW_S, start + 0.6 * WINDOW_S + OUTAGE_S
    state = {"down": False, "up": False}

    def outage() -> None:
        now = time.time()
        if not state["down"] and now >= kill_at:
            store.kill()
            state["down"] = True
        elif state["down"] and not state["up"] and now >= back_at:
            store.start()
            store.wait_ready()
            state["up"] = True

    rate, until = 2 * LIMIT / WINDOW_S, start + 3 * WINDOW_S
    sent = paced(clients, "hot", "outage", rate, until, between=outage)
    return sent, [sent.admitted[w] for w in sorted(sent.admitted)]


def run(options: Options) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="rls-bench-edge-") as tmp:
        workdir = Path(tmp)
        with server_group(workdir / "redis") as group:
            store = group.standalone()
            return report(options, measure(workdir, store))


def measure(workdir: Path, store: ServerProcess) -> dict[str, object]:
    runs: list[HotRun] = []
    for mode, flags in MODES.items():
        for load in BOUNDS:
            with fleet(workdir, store, *flags) as clients:
                runs.append(hot_run(clients, mode, "hot", load))
    for load in BOUNDS:
        with fleet(workdir, store) as clients:
            runs.append(hot_run(clients, "strict (per request)", "exact", load))
    with fleet(workdir, store) as clients:
        spread = switch_spread_ms(clients)
    under: dict[str, list[tuple[float, float]]] = {}
    for _ in range(UNDER_ROUNDS):  # alternating: the p99s of the two modes side by side
        for mode, flags in MODES.items():
            with fleet(workdir, store, *flags) as clients:
                under.setdefault(mode, []).append(under_half(clients))
    with fleet(workdir, store) as clients:
        tiny, fresh = tiny_limit(clients), fresh_keys(clients)
    with fleet(workdir, store) as clients:
        outage, outage_windows = store_killed(clients, store)
    return {"runs": runs, "spread": spread, "under": under, "tiny": tiny, "fresh": fresh,
            "outage": outage, "outage_windows": outage_windows,
            "decision_ns": decision_cost()}  # fmt: skip


def without_arrivals(sent: Sent) -> dict[str, object]:
    return {name: value for name, value in asdict(sent).items() if name != "arrivals"}


def report(options: Options, found: dict[str, object]) -> Outcome:
    runs = found["runs"]
    assert isinstance(runs, list)
    rows = [
        [r.mode, f"{r.load}x", " ".join(map(str, r.per_window)), str(r.worst),
         f"{r.worst / LIMIT:.3f}", f"{r.store_per_request:.3f}",
         passing(r.met()) if r.mode == "edge" else "-"]
        for r in runs
    ]  # fmt: skip
    header = ["mode", "load", "admitted per window", "worst", "/ MAX", "store/req", "target"]
    spread, under, fresh, tiny = found["spread"], found["under"], found["fresh"], found["tiny"]
    outage, windows = found["outage"], found["outage_windows"]
    assert isinstance(spread, list) and isinstance(outage, Sent) and isinstance(windows, list)
    assert isinstance(under, dict) and isinstance(fresh, float) and isinstance(tiny, int)
    p99 = max(spread, default=float("nan"))
    edge_work = max(work for work, _ in under["edge"])
    p99s = {mode: [p for _, p in pairs] for mode, pairs in under.items()}
    latency_ratio = median(p99s["edge"]) / median(p99s["eventual (before)"])
    cost = found["decision_ns"]
    assert isinstance(cost, dict)
    cost_ratio = min(cost["edge"]) / min(cost["eventual (before)"])  # the least disturbed
    outage_met = outage.errors == 0 and outage.slowest_ms <= STRICT_TIMEOUT_MS
    verdicts = [
        *(r.met() for r in runs if r.mode == "edge"),
        p99 <= SWITCH_TARGET_MS,
        edge_work <= UNDER_TARGET,
        cost_ratio <= LATENCY_RATIO,
        fresh <= FRESH_TARGET,
        tiny == 3,
        outage_met,
    ]
    lines = [
        f"one key, {LIMIT} per {WINDOW_S} s on {NODES} sidecars, {WINDOWS} whole windows",
        table(header, rows, left=2),
        f"switch, first to last node at the edge per window (ms): {[round(s) for s in spread]}"
        f", worst {fmt(p99)} ms, target <= {SWITCH_TARGET_MS:.0f}: {passing(p99 <= 50)}",
        f"key at {UNDER_LOAD}x of {UNDER_LIMIT:,}: {edge_work:.4f} store work per request, target"
        f" <= {UNDER_TARGET}: {passing(edge_work <= UNDER_TARGET)}; client p99 ms per round:"
        f" {', '.join(f'{m} {[round(p, 2) for p in v]}' for m, v in p99s.items())}; edge /"
        f" before (medians) {latency_ratio:.3f}",
        f"a decision in-process, away from the edge (ns, per round): "
        f"{', '.join(f'{m} {[round(c) for c in v]}' for m, v in cost.items())}; edge / before"
        f" (fastest rounds) {cost_ratio:.3f}, target <= {LATENCY_RATIO}:"
        f" {passing(cost_ratio <= LATENCY_RATIO)}",
        f"{FRESH:,} fresh keys: {fresh:.4f} per request, target <= {FRESH_TARGET}:"
        f" {passing(fresh <= FRESH_TARGET)}",
        f"a new key of 3 a minute, 3 gateways at once then again 30 ms later: {tiny} admitted,"
        f" target 3: {passing(tiny == 3)}",
        f"Redis killed {OUTAGE_S:.0f} s at the edge: {outage.requests} requests, {outage.errors}"
        f" errors, slowest {outage.slowest_ms:.1f} ms (target <= {STRICT_TIMEOUT_MS}), admitted"
        f" per window {windows}: {passing(outage_met)}",
    ]
    document = {
        "runs": [asdict(r) for r in runs], "switch_spread_ms": spread, "under_half": under,
        "fresh": fresh, "tiny": tiny, "outage": without_arrivals(outage),
        "outage_windows": windows,
        "decision_ns": cost,
    }  # fmt: skip
    return conclude(options, lines, document, verdicts)

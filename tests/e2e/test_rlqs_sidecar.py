"""Real Envoy 1.40 gateways on the sidecar's Rate Limit Quota Service, sharing one Redis.

Three scenarios run at once (the `observed` fixture, ~40 s: Envoy reports only every 5 s):

  shared  two RLQS gateways and one ShouldRateLimit gateway, each Envoy with its own sidecar,
          offered twice one api_key's limit for three windows
  leased  the same three gateways offered twice a strict api_key's limit meanwhile (RLQS:
          leases; ShouldRateLimit: one Redis call per request)
  trailing  and twice a strict sliding window's (leases whose unspent tokens move with time)
  restart one RLQS gateway whose sidecar is killed (SIGKILL) and started again on its port

Each test asserts on its part of what was recorded.
"""

from __future__ import annotations

import bisect
import functools
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.envoy import RLQS_TEMPLATE, EnvoyProcess
from harness.redis_servers import ServerGroup
from harness.rlqs_envoy import RlqsEnvoy
from harness.rules import write_rules
from harness.sidecar import SidecarProcess

pytestmark = pytest.mark.e2e

DOMAIN = "rlqs-e2e"
MAX, WINDOW_S, SPANS = 60, 10, 5  # the shared api_key limit
RULES = f"""\
domain: {DOMAIN}
descriptors:
  - key: api_key
    rate_limit: {{unit: second, unit_multiplier: {WINDOW_S}, requests_per_unit: {MAX},
                 spans: {SPANS}, cooldown: window_end}}
  - key: api_key
    value: leased
    rate_limit: {{unit: second, unit_multiplier: {WINDOW_S}, requests_per_unit: {MAX},
                 spans: {SPANS}, consistency: strict}}
  - key: api_key
    value: trailing
    rate_limit: {{unit: second, unit_multiplier: {WINDOW_S}, requests_per_unit: {MAX},
                 spans: {SPANS}, algorithm: sliding_window, consistency: strict}}
  - key: user
    # over after 3: DENY_ALL refreshed by the sidecar every report, with a TTL of ~6 s
    rate_limit: {{unit: minute, requests_per_unit: 3, spans: 30, cooldown: 1s}}
  - key: user
    value: banned
    rate_limit: {{unit: second, requests_per_unit: 0}}
"""
WINDOWS = 3
OFFERED_PER_WINDOW = 2 * MAX  # twice the limit
# Half of it to the ShouldRateLimit gateway, MAX alone: only the RLQS gateways' usage, counted
# in the same counter, keeps it under MAX.
ROTATION = ("rls", "rlqs-a", "rls", "rlqs-b")
REPORT_PERIOD_S = 5.0
BY_USER = {"user": "x-user"}


def status(url: str, header: str, value: str) -> int:
    request = urllib.request.Request(url, headers={header: value})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return error.code


def metric(sidecar: SidecarProcess, name: str) -> float:
    """One sample of the sidecar's /metrics (0 when absent)."""
    url = f"http://127.0.0.1:{sidecar.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=2) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(f"ratelimit_sidecar_{name} "):
                return float(line.split()[1])
    return 0.0


def wait_until(done: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll every 0.1 s; seconds it took, AssertionError after `timeout_s`."""
    start = time.monotonic()
    while not done():
        assert time.monotonic() - start < timeout_s, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.1)
    return time.monotonic() - start


@dataclass
class Shared:
    """The shared-limit run: every request's window, gateway and status."""

    requests: list[tuple[int, str, int]] = field(default_factory=list)
    sent: list[tuple[float, int]] = field(default_factory=list)  # each request's time, status

    def worst_trailing(self, window_s: float) -> int:
        """The most requests admitted in any `window_s` (a trailing window, not a fixed one)."""
        times = sorted(t for t, code in self.sent if code == 200)
        return max(
            (bisect.bisect_left(times, t + window_s) - i for i, t in enumerate(times)), default=0
        )

    def admitted(self, window: int, gateway: str | None = None) -> int:
        return sum(
            1 for w, g, s in self.requests if w == window and s == 200 and gateway in (None, g)
        )

    def refused(self, gateway: str, window: int | None = None) -> int:
        return sum(
            1 for w, g, s in self.requests if g == gateway and s == 429 and window in (None, w)
        )

    @property
    def windows(self) -> list[int]:
        return sorted({w for w, _, _ in self.requests})


@dataclass
class Restart:
    """The restart run: what a client of the gateway saw at each step, and how long each took."""

    first: list[int] = field(default_factory=list)  # a new bucket: its first requests
    denied_before_kill: bool = False
    fallback_after_s: float = 0.0  # from the kill to the first request let through
    reconnect_after_s: float = 0.0  # from the restart to an open stream
    deny_again_after_s: float = 0.0  # from the restart to `over` denied again
    new_bucket_after_restart: list[int] = field(default_factory=list)
    error: BaseException | None = None


def _shared_load(
    gateways: dict[str, str],
    seen: Shared,
    key: str = "shared",
    rotation: tuple[str, ...] = ROTATION,
) -> None:
    """Twice the limit for WINDOWS whole windows, paced, the gateways in `rotation`."""
    period = WINDOW_S / OFFERED_PER_WINDOW
    time.sleep(WINDOW_S - time.time() % WINDOW_S + 0.05)  # start on a window boundary
    start = time.time()
    for index in range(WINDOWS * OFFERED_PER_WINDOW):
        time.sleep(max(0.0, start + index * period - time.time()))
        name = rotation[index % len(rotation)]
        sent = time.time()
        code = status(gateways[name], "x-api-key", key)
        seen.requests.append((int(sent // WINDOW_S), name, code))
        seen.sent.append((sent, code))


def _restart(
    envoy: RlqsEnvoy,
    sidecar: list[SidecarProcess],
    start: Callable[..., SidecarProcess],
    seen: Restart,
) -> None:
    """New bucket, over its limit, sidecar killed, fallback, sidecar back, denied again."""
    try:
        url = envoy.url
        seen.first = [status(url, "x-user", "over")]  # no assignment yet: ALLOW_ALL
        time.sleep(0.3)  # the immediate report and its answer
        seen.first += [status(url, "x-user", "over") for _ in range(4)]
        seen.denied_before_kill = status(url, "x-user", "over") == 429
        sidecar[0].stop(signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: status(url, "x-user", "over") == 200, 15, "fallback")
        seen.fallback_after_s = time.monotonic() - killed
        sidecar[0] = start()
        restarted = time.monotonic()
        wait_until(lambda: metric(sidecar[0], "rlqs_streams") >= 1, 10, "reconnect")
        seen.reconnect_after_s = time.monotonic() - restarted
        seen.new_bucket_after_restart = [status(url, "x-user", "banned")]
        time.sleep(0.3)
        seen.new_bucket_after_restart += [status(url, "x-user", "banned") for _ in range(3)]
        wait_until(lambda: status(url, "x-user", "over") == 429, 20, "denied again")
        seen.deny_again_after_s = time.monotonic() - restarted
    except BaseException as error:  # reported by the tests, after the other run ends
        seen.error = error


@dataclass
class Observed:
    shared: Shared
    restart: Restart
    leased: Shared
    trailing: Shared


def _envoys(workdir: Path, sidecars: dict[str, list[SidecarProcess]]) -> list[EnvoyProcess]:
    """The RLS gateway and the two RLQS ones on the shipped bootstraps (envoy/*.tmpl; the RLQS
    one buckets by api_key), and the restart one bucketing by user."""
    port = {name: running[0].port for name, running in sidecars.items()}
    return [
        EnvoyProcess(workdir, port["rls"], "rls", domain=DOMAIN),
        *(
            EnvoyProcess(workdir, port[name], name, domain=DOMAIN, template=RLQS_TEMPLATE)
            for name in ("rlqs-a", "rlqs-b")
        ),
        RlqsEnvoy(workdir, port["restart"], "restart", domain=DOMAIN, bucket_headers=BY_USER),
    ]


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    workdir = tmp_path_factory.mktemp("rlqs-sidecar")
    rules = write_rules(workdir, RULES, f"{DOMAIN}.yaml")
    group = ServerGroup(workdir / "redis")
    sidecars: dict[str, list[SidecarProcess]] = {}  # a list: the restart one is replaced
    envoys: list[EnvoyProcess] = []
    try:
        redis = group.standalone()

        def start(name: str, ports: tuple[int, int] | None = None) -> SidecarProcess:
            flags = ("--redis-url", redis.url, "--node-id", name)
            return SidecarProcess(rules, *flags, ports=ports).wait_ready()

        for name in ("rls", "rlqs-a", "rlqs-b", "restart"):
            sidecars[name] = [start(name)]
        envoys = _envoys(workdir, sidecars)
        for envoy in envoys:
            envoy.wait_ready()
        seen = Observed(Shared(), Restart(), Shared(), Shared())
        first = sidecars["restart"][0]
        again = functools.partial(start, "restart", (first.port, first.metrics_port))
        args = (envoys[3], sidecars["restart"], again, seen.restart)
        side = threading.Thread(target=_restart, args=args)
        side.start()
        gateways = {e.config.stem: e.url for e in envoys[:3]}
        leases = (gateways, seen.leased, "leased", ROTATION)
        leased = threading.Thread(target=_shared_load, args=leases)
        leased.start()
        trails = (gateways, seen.trailing, "trailing", ROTATION)
        trailing = threading.Thread(target=_shared_load, args=trails)
        trailing.start()
        _shared_load(gateways, seen.shared)
        leased.join(60)
        trailing.join(60)
        side.join(60)
        yield seen
    finally:
        for envoy in envoys:
            envoy.stop()
        for running in sidecars.values():
            running[0].stop()
        group.stop_all()


# --- one limit, three gateways, two protocols --------------------------------------------------

RLQS_SHARE = 1 / 2  # of the offered load
# The RLS path's own bound, MAX x (1 + 1/N) (README, tests/e2e/test_envoy.py), plus what the
# RLQS gateways are offered between the fleet's count crossing MAX and their DENY_ALL: one
# report period (the sidecar hears of their usage at reports) and one span (the fleet's count
# reaches their sidecar). The simulator's bound for RLQS alone, C x (ceil(W/P) + 1) + MAX
# (simulate/rlqs.py window_bound), is 240 here: above the 120 offered.
WINDOW_BOUND = MAX * (1 + 1 / SPANS) + RLQS_SHARE * OFFERED_PER_WINDOW / WINDOW_S * (
    REPORT_PERIOD_S + WINDOW_S / SPANS
)


def test_three_gateways_share_one_limit_per_window(observed: Observed) -> None:
    shared = observed.shared
    windows = shared.windows
    assert len(windows) == WINDOWS, windows
    admitted = [shared.admitted(w) for w in windows]
    assert all(0.75 * MAX <= a <= WINDOW_BOUND for a in admitted), (admitted, WINDOW_BOUND)
    # offered MAX alone, the RLS gateway refuses only because the RLQS usage is counted too
    assert all(shared.refused("rls", w) for w in windows), "RLQS usage not counted"


def test_every_gateway_admits_and_refuses_in_turn(observed: Observed) -> None:
    shared = observed.shared
    for gateway in ("rls", "rlqs-a", "rlqs-b"):
        per_window = [shared.admitted(w, gateway) for w in shared.windows]
        assert all(per_window), (gateway, per_window)  # nobody starved
        assert shared.refused(gateway) > 0, gateway  # and each enforced the limit itself


# --- a strict limit on RLQS gateways: leased ---------------------------------------------------

# Each gateway's bucket is abandoned at a window's end; the request that makes it anew passes by
# Envoy's no-assignment fallback, counted in advance (one a gateway), and one may be sent on
# either side of the boundary as the client's clock and the store's split it.
LEASE_SLACK = 2 + 1


def test_a_strict_limit_holds_max_across_both_kinds_of_gateway(observed: Observed) -> None:
    """`consistency: strict`: an RLQS bucket's every token is counted in Redis before it is
    spent (a lease), a ShouldRateLimit request is decided on Redis, both in the same counter,
    so the three gateways offered twice MAX admit at most MAX a window, where the plain
    assignments admit up to a report period of usage more (the bound above)."""
    leased = observed.leased
    assert len(leased.windows) == WINDOWS, leased.windows
    admitted = [leased.admitted(w) for w in leased.windows]
    assert all(0.6 * MAX <= a <= MAX + LEASE_SLACK for a in admitted), admitted
    for gateway in ("rls", "rlqs-a", "rlqs-b"):
        assert all(leased.admitted(w, gateway) for w in leased.windows), (gateway, admitted)


def test_a_strict_sliding_window_holds_max_in_every_trailing_window(observed: Observed) -> None:
    """A strict sliding window: an RLQS bucket's tokens are counted when leased, and what it has
    not reported spent moves to the current span at each sync, so no token leaves the trailing
    window before the request it admits. Any 10 s of the run admits at most what the sliding
    rule allows (MAX, and its oldest span's part: MAX / SPANS), where plain assignments admit
    up to a report period of the RLQS gateways' usage more (WINDOW_BOUND)."""
    trailing = observed.trailing
    assert len(trailing.windows) == WINDOWS, trailing.windows
    worst = trailing.worst_trailing(WINDOW_S)
    assert 0.6 * MAX <= worst <= MAX * (1 + 1 / SPANS) + LEASE_SLACK < WINDOW_BOUND, worst
    for gateway in ("rls", "rlqs-a", "rlqs-b"):
        assert trailing.refused(gateway) > 0, gateway
        assert any(g == gateway and s == 200 for _, g, s in trailing.requests), gateway


# --- a new bucket, a killed sidecar ------------------------------------------------------------

# core/quota_assign.py deny_until: a DENY_ALL lasts until the next report, sync or block end, + 1 s
DENY_TTL_S = REPORT_PERIOD_S + 1


def test_a_new_bucket_is_assigned_on_its_first_report(observed: Observed) -> None:
    restart = observed.restart
    assert restart.error is None, repr(restart.error)
    # 3 per minute; the first request reports the bucket at once, the answer limits the next
    # ones within 0.3 s, long before Envoy's next timer report
    assert restart.first[0] == 200 and 429 in restart.first, restart.first
    assert restart.first.count(200) <= 3, restart.first
    # a deny list, asked first of the restarted sidecar: DENY_ALL from its first report
    assert restart.new_bucket_after_restart == [200, 429, 429, 429]


def test_a_killed_sidecar_leaves_envoy_on_its_fallback_after_the_ttl(observed: Observed) -> None:
    restart = observed.restart
    assert restart.error is None, repr(restart.error)
    assert restart.denied_before_kill
    # the DENY_ALL outlives the stream until its TTL, then no_assignment_behavior (ALLOW_ALL)
    assert 0.5 < restart.fallback_after_s <= DENY_TTL_S + 2, restart


def test_a_restarted_sidecar_gets_the_stream_back_and_assigns_again(observed: Observed) -> None:
    restart = observed.restart
    assert restart.error is None, repr(restart.error)
    # Envoy reopens the stream at its next timer report
    assert restart.reconnect_after_s <= REPORT_PERIOD_S + 1, restart
    assert restart.deny_again_after_s <= 3 * REPORT_PERIOD_S, restart

"""The `retry_storm` scenario: clients that react to 429s, obedient or hammering (issue #16).

Unlike the other scenarios, traffic here depends on the answers. Each client has its own key
(its own limit of MAX per window, as an API key would) and one request outstanding at a time:

* it sends fresh requests at `client_load` x MAX per window on average (Poisson), each to a
  node the load balancer picks;
* an **obedient** client, refused, waits exactly the Retry-After it was given (whole seconds,
  as the service sends it: service/response.py) and retries the same request, up to
  `obedient_tries` times, sending nothing else meanwhile;
* a **hammering** client retries at once, every `hammer_gap_ms`, up to `hammer_tries` times,
  then drops the request and goes on.

The fleet is the same discrete-event engine as every scenario (engine.py: the real core on
each node, syncing with one shared store); only the arrivals come from the clients.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace
from random import Random

from ratelimit_sidecar.core import Code, Hit
from ratelimit_sidecar.service.response import retry_after_seconds
from simulator.engine import Engine
from simulator.params import SimParams, StormParams
from simulator.scenarios import Setup, resolve
from simulator.stormstats import StormRecorder, StormSummary, summarize_storm
from simulator.variants import system_for

SCENARIO = "retry_storm"
CLIENT = 5  # an event kind after the engine's own (BOOT ... APPLY)


@dataclass
class Client:
    index: int
    hammer: bool
    key: tuple[str, ...]
    tries: int = 0  # retries of the request outstanding (0: a fresh one)


class StormEngine(Engine):
    """The engine, with arrivals from clients instead of an open-loop traffic stream."""

    def __init__(self, setup: Setup, system: str, storm: StormParams) -> None:
        super().__init__(setup, system_for(system))
        self.storm = storm
        self.rng = Random(setup.params.seed)
        count = storm.obedient + storm.hammering
        self.clients = [
            Client(i, i >= storm.obedient, ("sim", "client", f"c{i}")) for i in range(count)
        ]
        p = setup.params
        self.gap_ms = p.window_ms / (storm.client_load * p.max)  # mean, between fresh requests
        self.stats = StormRecorder(setup.start_ms, p.window_ms, p.windows, p.max)
        self.stats.clients = (storm.obedient, storm.hammering)

    def run_storm(self) -> StormRecorder:
        setup = self.setup
        for i in range(setup.membership.initial):
            self._at(setup.boot_ms, 0, i)  # BOOT
        for change in setup.membership.changes:
            self._at(change.at_ms, 0 if change.joins else 1, change.node)
        for client in self.clients:
            self._fresh(client, setup.start_ms)
        while self.heap:
            t, _, kind, index, payload = heapq.heappop(self.heap)
            if t >= setup.end_ms:
                break
            self.now = t
            if kind == CLIENT:
                self._send(self.clients[index])
            else:
                self._dispatch(kind, index, payload)
        return self.stats

    def _fresh(self, client: Client, after_ms: int) -> None:
        client.tries = 0
        self._at(after_ms + round(self.rng.expovariate(1 / self.gap_ms)), CLIENT, client.index)

    def _send(self, client: Client) -> None:
        node = self.nodes[self._pick_node()]
        t = self.now
        decision = node.limiter.hit(t + node.offset, [Hit(self.rule, client.key, 1)])
        if not node.tracking:
            self._first_key(node)
        ok = decision.code is Code.OK
        self.stats.request(t, client.index, client.hammer, ok, client.tries)
        if ok:
            self._fresh(client, t)
        elif client.hammer:
            self._hammer(client, t)
        else:
            self._obey(client, t, retry_after_seconds(decision) * 1000)

    def _obey(self, client: Client, t: int, wait_ms: int) -> None:
        if client.tries >= self.storm.obedient_tries:
            self._fresh(client, t)  # gives the request up
            return
        self.stats.stated(wait_ms)
        client.tries += 1
        self._at(t + wait_ms, CLIENT, client.index)

    def _hammer(self, client: Client, t: int) -> None:
        if client.tries >= self.storm.hammer_tries:
            self._fresh(client, t)
            return
        client.tries += 1
        self._at(t + self.storm.hammer_gap_ms, CLIENT, client.index)

    def _pick_node(self) -> int:
        """The load balancer: a serving node, by weight."""
        members = self.setup.membership
        serving = [i for i in members.active_at(self.now) if i in self.nodes]
        weights = [members.weights[i] for i in serving]
        return self.rng.choices(serving, weights)[0]


def storm_setup(params: SimParams) -> Setup:
    """The fleet, rule and run length of `params`; traffic comes from the clients."""
    return replace(resolve(replace(params, scenario="steady")), name=SCENARIO)


def run_storm(
    params: SimParams, storm: StormParams, system: str = "core", repeat: int = 1
) -> tuple[StormSummary, StormRecorder]:
    """`repeat` seeds from params.seed, pooled; the first seed's recorder, for plots."""
    recorders = []
    for k in range(repeat):
        setup = storm_setup(replace(params, seed=params.seed + k))
        recorders.append(StormEngine(setup, system, storm).run_storm())
    return summarize_storm(recorders, params, storm, system), recorders[0]

"""What the `retry_storm` scenario measures (storm.py), and its table.

Per true window (requests by arrival time), for obedient and hammering clients apart:

* answered: every request the fleet had to decide, fresh ones and retries;
* admitted: those it admitted (per client, a key's limit is MAX per window).

Obedient clients' retries:

* first retry: the first retry of a refused request, sent exactly the Retry-After later;
  `first ok` is the share of them admitted (the target: at least 90 %).
* stated wait: the Retry-After the refusals gave, in ms (whole seconds, as sent).

Hammering clients: `req/adm` is how many requests each admitted one cost the fleet; `held
off` is the share of their requests refused; `late adm` their admitted per client and window
over the second half of the run, over MAX: how far the limiter holds them down once
penalties (if any) have built up; `locked out at` the window (median over hammering clients)
in which a hammering client first got nothing at all (the run's length in windows: never).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from simulator.metrics import percentile
from simulator.params import SimParams, StormParams, penalty_text


class StormRecorder:
    """Counts per window and kind of client (0 obedient, 1 hammering)."""

    def __init__(self, start_ms: int, window_ms: int, windows: int, max_: int) -> None:
        self.start_ms, self.window_ms, self.max = start_ms, window_ms, max_
        self.clients = (0, 0)  # obedient, hammering
        self.answered = [[0] * windows, [0] * windows]
        self.admitted = [[0] * windows, [0] * windows]
        self.first_retries = 0
        self.first_admitted = 0
        self.waits: list[int] = []
        self.hammer_admitted: dict[int, set[int]] = {}  # hammering client -> windows admitted

    def lockouts(self) -> list[float]:
        """Per hammering client, the first window it got nothing in (its index; the number
        of windows if none): how soon it is held off for a whole window."""
        windows = len(self.answered[0])
        first = self.clients[0]
        return [
            float(
                next(
                    (w for w in range(windows) if w not in self.hammer_admitted.get(c, ())), windows
                )
            )
            for c in range(first, first + self.clients[1])
        ]

    def request(self, t: int, client: int, hammer: bool, ok: bool, tries: int) -> None:
        window = (t - self.start_ms) // self.window_ms
        if not 0 <= window < len(self.answered[0]):
            return
        self.answered[hammer][window] += 1
        self.admitted[hammer][window] += ok
        if hammer and ok:
            self.hammer_admitted.setdefault(client, set()).add(window)
        if not hammer and tries == 1:
            self.first_retries += 1
            self.first_admitted += ok

    def stated(self, wait_ms: int) -> None:
        self.waits.append(wait_ms)


@dataclass(frozen=True)
class StormSummary:
    system: str
    algorithm: str
    seeds: int
    nodes: int
    max: int
    window_s: float
    windows: int
    obedient: int
    hammering: int
    client_load: float
    penalty: str
    answered_per_window: float  # the whole fleet: every request it decided
    obedient_answered: float  # per obedient client and window
    obedient_admitted: float  # per obedient client and window, over MAX
    first_retries: int
    first_ok_pct: float
    wait_p50_ms: float
    wait_p95_ms: float
    hammer_answered: float  # per hammering client and window
    hammer_admitted: float  # per hammering client and window, over MAX
    hammer_late_admitted: float  # the same over the run's second half
    hammer_req_per_admitted: float
    hammer_held_off_pct: float
    lockout_window_p50: float  # hammering clients' first window with nothing admitted (median)


def summarize_storm(
    recorders: list[StormRecorder], params: SimParams, storm: StormParams, system: str
) -> StormSummary:
    windows = params.windows * len(recorders)
    ob, hm = max(1, storm.obedient), max(1, storm.hammering)
    answered = [sum(sum(r.answered[k]) for r in recorders) for k in (0, 1)]
    admitted = [sum(sum(r.admitted[k]) for r in recorders) for k in (0, 1)]
    half = params.windows // 2
    late = sum(sum(r.admitted[1][half:]) for r in recorders)
    late_windows = (params.windows - half) * len(recorders)
    first = sum(r.first_retries for r in recorders)
    first_ok = sum(r.first_admitted for r in recorders)
    waits = [float(w) for r in recorders for w in r.waits]
    return StormSummary(
        system=system,
        algorithm=params.algorithm.text,
        seeds=len(recorders),
        nodes=params.nodes,
        max=params.max,
        window_s=params.window_ms / 1000,
        windows=params.windows,
        obedient=storm.obedient,
        hammering=storm.hammering,
        client_load=storm.client_load,
        penalty=penalty_text(params.penalty),
        answered_per_window=round(sum(answered) / windows, 1),
        obedient_answered=round(answered[0] / windows / ob, 1),
        obedient_admitted=round(admitted[0] / windows / ob / params.max, 3),
        first_retries=first,
        first_ok_pct=round(100 * first_ok / first, 1) if first else 100.0,
        wait_p50_ms=percentile(waits, 50),
        wait_p95_ms=percentile(waits, 95),
        hammer_answered=round(answered[1] / windows / hm, 1),
        hammer_admitted=round(admitted[1] / windows / hm / params.max, 3),
        hammer_late_admitted=round(late / late_windows / hm / params.max, 3),
        hammer_req_per_admitted=round(answered[1] / admitted[1], 1) if admitted[1] else 0.0,
        lockout_window_p50=percentile([w for r in recorders for w in r.lockouts()], 50),
        hammer_held_off_pct=(
            round(100 * (answered[1] - admitted[1]) / answered[1], 1) if answered[1] else 0.0
        ),
    )


COLUMNS = (
    ("penalty", "penalty"),
    ("answered_per_window", "fleet req/win"),
    ("obedient_answered", "obed req/win"),
    ("obedient_admitted", "obed adm/MAX"),
    ("first_retries", "1st retries"),
    ("first_ok_pct", "1st ok %"),
    ("wait_p50_ms", "wait p50 ms"),
    ("wait_p95_ms", "wait p95 ms"),
    ("hammer_answered", "hamm req/win"),
    ("hammer_admitted", "hamm adm/MAX"),
    ("hammer_late_admitted", "late adm/MAX"),
    ("hammer_req_per_admitted", "req/adm"),
    ("hammer_held_off_pct", "held off %"),
    ("lockout_window_p50", "locked out at"),
)


def render_storm(summaries: list[StormSummary], fmt: str) -> str:
    if fmt == "json":
        return json.dumps([asdict(s) for s in summaries], indent=2)
    head = [title for _, title in COLUMNS]
    rows = [[str(getattr(s, name)) for name, _ in COLUMNS] for s in summaries]
    first = summaries[0]
    about = (
        f"retry_storm, {first.algorithm}: {first.nodes} nodes, MAX {first.max} per "
        f"{first.window_s:g} s per "
        f"client key, {first.obedient} obedient + {first.hammering} hammering clients at "
        f"{first.client_load:g}x, {first.windows} windows x {first.seeds} seed(s)"
    )
    if fmt == "markdown":
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return about + "\n\n" + "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return about + "\n" + "\n".join(lines)

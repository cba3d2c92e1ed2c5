"""Render summaries as an aligned text table, a Markdown table (for docs) or JSON."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict

from simulator.metrics import Summary

Cell = Callable[[Summary], str]


def _nodes(s: Summary) -> str:
    return "-" if s.nodes_error_pct is None else f"{s.nodes_error_pct:.0f}"


def _lag(s: Summary) -> str:
    return "-" if not s.exposed else f"{s.lag_mean_ms:.0f}/{s.lag_p95_ms:.0f}"


# (header, cell) in display order; headers are short so the table fits 120 columns.
COLUMNS: list[tuple[str, Cell]] = [
    ("scenario", lambda s: s.scenario),
    ("system", lambda s: s.system),
    ("win", lambda s: str(s.windows)),
    ("offered/w", lambda s: f"{s.offered_per_window:.0f}"),
    ("MAX", lambda s: str(s.max)),
    ("adm mean", lambda s: f"{s.admitted_mean:.1f}"),
    ("p95", lambda s: f"{s.admitted_p95:.0f}"),
    ("max", lambda s: str(s.admitted_max)),
    ("over max%", lambda s: f"{s.overshoot_max_pct:.1f}"),
    ("over mean%", lambda s: f"{s.overshoot_mean_pct:.2f}"),
    ("w>MAX", lambda s: str(s.windows_over)),
    ("lag ms mean/p95", _lag),
    ("unblk", lambda s: f"{s.unblocked}/{s.exposed}"),
    ("false-rej%", lambda s: f"{s.false_rejection_pct:.2f}"),
    ("(n/eligible)", lambda s: f"{s.false_rejections}/{s.eligible}"),
    ("nodes err%", _nodes),
    ("store/req", lambda s: f"{s.store_per_request:.3f}"),
    ("cpu s", lambda s: f"{s.cpu_s:.2f}"),
]


# `--algorithm`: each rule against its exact reference (definitions in metrics.py).
RULE_COLUMNS: list[tuple[str, Cell]] = [
    ("scenario", lambda s: s.scenario),
    ("system", lambda s: s.system),
    ("algorithm", lambda s: s.algorithm),
    ("win", lambda s: str(s.windows)),
    ("offered/w", lambda s: f"{s.offered_per_window:.0f}"),
    ("adm/w", lambda s: f"{s.admitted_mean:.1f}"),
    ("bound", lambda s: str(s.bound)),
    ("trail", lambda s: str(s.trailing_max)),
    ("exact", lambda s: str(s.trailing_exact)),
    ("over exact%", lambda s: f"{s.trailing_over_exact_pct:.1f}"),
    ("over bound%", lambda s: f"{s.trailing_over_bound_pct:.1f}"),
    ("false-rej%", lambda s: f"{s.false_vs_exact_pct:.2f}"),
    ("(n/exact adm)", lambda s: f"{s.false_vs_exact}/{s.exact_admitted}"),
    ("exact rej", lambda s: str(s.exact_rejected)),
    ("store/req", lambda s: f"{s.store_per_request:.3f}"),
    ("cpu s", lambda s: f"{s.cpu_s:.2f}"),
]
VIEWS = {"classic": COLUMNS, "rule": RULE_COLUMNS}


def render(summaries: Sequence[Summary], fmt: str, view: str = "classic") -> str:
    if fmt == "json":
        return json.dumps([asdict(s) for s in summaries], indent=2)
    columns = VIEWS[view]
    rows = [[cell(s) for _, cell in columns] for s in summaries]
    headers = [h for h, _ in columns]
    if fmt == "markdown":
        return _markdown(headers, rows)
    if fmt == "table":
        return _text(headers, rows)
    raise ValueError(f"unknown format {fmt!r}")


def _text(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        parts = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in pairs]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _markdown(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)

"""Prometheus metrics: the registry the server fills (`Metrics`), the hot-path tallies read at
scrape time (`hot.py`), the penalty collector (`penalty.py`) and the rule labels (`labels.py`)."""

from __future__ import annotations

from ratelimit_sidecar.metrics.registry import Metrics

__all__ = ["Metrics"]

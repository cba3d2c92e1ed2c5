"""Window and span arithmetic on integer milliseconds.

Span k of window w starts at `w*W + ceil(k*W/N)`: spans tile the window exactly (lengths differ by
at most 1 ms) on the same epoch-aligned boundaries on every node.
"""

from __future__ import annotations

from ratelimit_sidecar.config.model import RateLimit


def window_of(now_ms: int, window_ms: int) -> int:
    return now_ms // window_ms


def span_index(now_ms: int, window_ms: int, spans: int) -> int:
    return (now_ms % window_ms) * spans // window_ms


def span_end(now_ms: int, window_ms: int, spans: int) -> int:
    """The first ms of the span after the one `now_ms` is in."""
    following = span_index(now_ms, window_ms, spans) + 1
    return now_ms - now_ms % window_ms + (following * window_ms + spans - 1) // spans


def window_end(now_ms: int, window_ms: int) -> int:
    return (now_ms // window_ms + 1) * window_ms


def span_number(now_ms: int, limit: RateLimit) -> int:
    """Numbered from the epoch: window * spans + index."""
    window_ms, spans = limit.window_ms, limit.spans
    return now_ms // window_ms * spans + (now_ms % window_ms) * spans // window_ms


def span_bounds(span: int, limit: RateLimit) -> tuple[int, int]:
    """The first ms of span number `span` and the first ms after it."""
    window, index = divmod(span, limit.spans)
    base, window_ms, spans = window * limit.window_ms, limit.window_ms, limit.spans
    return base + (index * window_ms + spans - 1) // spans, (
        base + ((index + 1) * window_ms + spans - 1) // spans
    )

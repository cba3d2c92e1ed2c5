"""The admin API's JSON: reading request bodies strictly, and showing the history."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

from ratelimit_sidecar.overrides.store import Change

MAX_DEPTH = 32  # nesting a valid body never needs (an override is 3 levels deep)


class BodyError(ValueError):
    """A body that is not acceptable JSON (400)."""


def json_body(raw: bytes) -> object:
    """The JSON value of a request body: UTF-8, no NaN or Infinity, bounded nesting."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyError("the body is not valid UTF-8") from None
    if _depth(text) > MAX_DEPTH:
        raise BodyError(f"the body nests deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique)
    except BodyError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, an integer too long
        raise BodyError(f"invalid JSON: {str(exc)[:200]}") from None


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """An object whose keys are all different: a repeated key is refused, not silently
    overwritten."""
    found: dict[str, object] = {}
    for key, value in pairs:
        if key in found:
            raise BodyError(f"invalid JSON: key {key[:80]!r} is repeated")
        found[key] = value
    return found


def _no_constant(name: str) -> object:
    raise BodyError(f"invalid JSON: {name} is not a number JSON allows")


def _depth(text: str) -> int:
    """The deepest nesting of brackets outside strings (checked before parsing, so that a deep
    body costs one pass and no recursion)."""
    deepest = depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def history_view(changes: Sequence[Change]) -> list[dict[str, object]]:
    """Newest first: version, time (RFC 3339), action, and each override touched."""
    return [
        {
            "version": change.version,
            "time": _rfc3339(change.time_ms),
            "action": change.action,
            "overrides": [
                {"id": override_id, "before": before, "after": after}
                for override_id, before, after in change.touched
            ],
        }
        for change in changes
    ]


def _rfc3339(time_ms: int) -> str:
    moment = datetime.fromtimestamp(time_ms / 1000, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")

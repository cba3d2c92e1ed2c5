"""A runtime override as the admin API takes it: parse, validate, and build its rule (pure).

    {"domain": "gateway", "descriptor": [{"key": "api_key", "value": "tk_bot_9382"}],
     "rate_limit": {"unit": "minute", "requests_per_unit": 500},
     "expires_at": "2026-12-01T00:00:00Z", "note": "upgraded to pro"}

`rate_limit(s)` goes through the rule files' reader (as YAML nodes): same keys, bounds and messages.
The id depends on domain and descriptor alone (a PUT for the same pair replaces). Stores keep the
body as accepted, normalised, with its "id".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import yaml
from yaml.nodes import Node

from ratelimit_sidecar.config.limitreader import LimitReader, ParsedLimits
from ratelimit_sidecar.config.model import DEFAULT_RULES, Rule, RuleDefaults, Source

BODY_KEYS = ("domain", "descriptor", "rate_limit", "rate_limits", "expires_at", "note")
ENTRY_KEYS = ("key", "value")
MAX_NOTE_CHARS = 1024
MAX_DOMAIN_BYTES = 1024
SOURCE_FILE = "override"  # Problem.file of a rate_limit problem: dropped from the message

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Entries = tuple[tuple[str, str], ...]


class OverrideError(ValueError):
    """Refused with 400; the message names the key."""


@dataclass(frozen=True, slots=True)
class OverrideBounds:
    """The request bounds a descriptor must fit, and what rule files leave unsaid."""

    max_entries: int = 16
    max_value_bytes: int = 1024
    defaults: RuleDefaults = DEFAULT_RULES


@dataclass(frozen=True, slots=True)
class Override:
    id: str
    domain: str
    entries: Entries
    rule: Rule
    expires_at_ms: int | None  # None: until deleted
    document: Mapping[str, object]

    def expired(self, now_ms: int) -> bool:
        return self.expires_at_ms is not None and now_ms >= self.expires_at_ms


def override_id(domain: str, entries: Entries) -> str:
    """Deterministic: the same domain and descriptor always name the same override."""
    raw = json.dumps([domain, [list(entry) for entry in entries]], ensure_ascii=False)
    return "ovr_" + hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def parse_override(body: object, bounds: OverrideBounds) -> Override:
    """Raises OverrideError."""
    if not isinstance(body, dict):
        raise OverrideError("the body must be a JSON object")
    unknown = [str(key) for key in body if key not in BODY_KEYS]
    if unknown:
        raise OverrideError(f"unknown key {unknown[0]!r} (allowed: {', '.join(BODY_KEYS)})")
    domain = _domain(body.get("domain"))
    entries = _entries(body.get("descriptor"), bounds)
    limits = _limits(body, bounds.defaults)
    expires_at_ms, expires_text = _expiry(body.get("expires_at"))
    note = _note(body.get("note"))
    ident = override_id(domain, entries)
    document: dict[str, object] = {
        "id": ident,
        "domain": domain,
        "descriptor": [{"key": key, "value": value} for key, value in entries],
    }
    for key in ("rate_limit", "rate_limits"):
        if key in body:
            document[key] = body[key]
    if expires_text:
        document["expires_at"] = expires_text
    if note:
        document["note"] = note
    rule = _rule(ident, domain, entries, limits)
    return Override(ident, domain, entries, rule, expires_at_ms, document)


def _domain(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise OverrideError("domain: required, a non-empty string")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_DOMAIN_BYTES:
        raise OverrideError(f"domain: longer than {MAX_DOMAIN_BYTES} bytes")
    return value


def _entries(value: object, bounds: OverrideBounds) -> Entries:
    if not isinstance(value, list) or not value:
        raise OverrideError("descriptor: required, a non-empty list of {key, value}")
    if len(value) > bounds.max_entries:
        raise OverrideError(
            f"descriptor: {len(value)} entries, more than the request bound of"
            f" {bounds.max_entries} (--max-entries)"
        )
    return tuple(_entry(item, f"descriptor[{i}]", bounds) for i, item in enumerate(value))


def _entry(item: object, where: str, bounds: OverrideBounds) -> tuple[str, str]:
    if not isinstance(item, dict):
        raise OverrideError(f"{where}: must be an object {{key, value}}")
    unknown = [str(key) for key in item if key not in ENTRY_KEYS]
    if unknown:
        raise OverrideError(f"{where}: unknown key {unknown[0]!r} (allowed: key, value)")
    key, value = item.get("key"), item.get("value")
    if not isinstance(key, str) or not key:
        raise OverrideError(f"{where}.key: required, a non-empty string")
    if not isinstance(value, str):
        raise OverrideError(f"{where}.value: required, a string")
    for name, text in (("key", key), ("value", value)):
        if len(text.encode("utf-8", "surrogatepass")) > bounds.max_value_bytes:
            raise OverrideError(
                f"{where}.{name}: longer than the request bound of {bounds.max_value_bytes}"
                " bytes (--max-value-bytes)"
            )
    return key, value


def _limits(body: Mapping[str, object], defaults: RuleDefaults) -> ParsedLimits:
    present = {key: json_node(body[key]) for key in ("rate_limit", "rate_limits") if key in body}
    if not present:
        raise OverrideError("rate_limit: required (the same keys as in a rule file)")
    reader = LimitReader(SOURCE_FILE)
    reader.defaults = defaults
    parsed = reader.limits(present, "")
    if reader.problems:
        problem = reader.problems[0]
        raise OverrideError(f"{problem.key}: {problem.message}")
    if not parsed.unlimited and not parsed.limits:
        raise OverrideError("rate_limit: must not be empty")
    return parsed


def _expiry(value: object) -> tuple[int | None, str]:
    """RFC 3339 in UTC, as epoch ms and normalised text."""
    if value is None:
        return None, ""
    if not isinstance(value, str) or "T" not in value.upper():
        raise OverrideError("expires_at: must be an RFC 3339 time in UTC like 2026-12-01T00:00:00Z")
    try:
        moment = datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError:
        raise OverrideError(f"expires_at: not an RFC 3339 time: {value[:64]!r}") from None
    if moment.utcoffset() != timedelta(0):  # None too: no offset given
        raise OverrideError("expires_at: must be in UTC (end with Z or +00:00)")
    moment = moment.astimezone(UTC)
    milliseconds = (moment - _EPOCH) // timedelta(milliseconds=1)  # exact: no float on the way
    text = moment.isoformat(timespec="milliseconds" if moment.microsecond else "seconds")
    return milliseconds, text.replace("+00:00", "Z")


def _note(value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise OverrideError("note: must be a string")
    if len(value) > MAX_NOTE_CHARS:
        raise OverrideError(f"note: longer than {MAX_NOTE_CHARS} characters")
    return value


def _rule(ident: str, domain: str, entries: Entries, parsed: ParsedLimits) -> Rule:
    """Keys only in the path: metric labels never carry values (often API keys)."""
    rule = Rule(
        domain=domain,
        path=tuple((key, "") for key, _ in entries),
        limits=parsed.limits,
        unlimited=parsed.unlimited,
        source=Source(f"override {ident}", 0),
        replaces=parsed.replaces,
    )
    object.__setattr__(rule, "id", f"{domain}.override_{ident}")
    return rule


def json_node(value: object) -> Node:
    """As the YAML node tree the rule file readers walk (PyYAML's dump round-trips JSON)."""
    node = yaml.compose(yaml.safe_dump(value, sort_keys=False), Loader=yaml.SafeLoader)
    assert node is not None
    return node

"""What the metrics address answers: health, readiness, and read-only JSON views."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Protocol

from ratelimit_sidecar.config.model import Rule, RuleSet
from ratelimit_sidecar.core import KeyId, Limiter
from ratelimit_sidecar.http_server.server import Reply, Route, json_reply, text_reply
from ratelimit_sidecar.storage.keys import digest, value_digest

DEFAULT_KEYS = 20
HEALTH_PATHS = ("/healthcheck", "/healthz", "/readyz")  # what --health-address serves
MAX_KEYS_SHOWN = 1000


class StoreStatus(Protocol):
    """What readiness reports of the store: the sync loop's view (always up when local-only)."""

    store_up: bool
    last_error: str
    key_errors: int  # keys the store answered but did not apply in the last sync
    heartbeat_error: str  # why the last heartbeat failed ("": it did not)


def rule_view(rule: Rule) -> dict[str, object]:
    limit = rule.limit
    return {
        "id": rule.id,
        "path": [list(step) for step in rule.path],
        "limit": None
        if limit is None
        else {
            "requests_per_unit": limit.requests_per_unit,
            "unit": limit.unit.name.lower(),
            "window_s": limit.window_seconds,
            "spans": limit.spans,
            "cooldown_ms": limit.cooldown,
            "cooldown_window_end": limit.cooldown_window_end,
            "penalty": None if limit.penalty is None else asdict(limit.penalty),
            "name": limit.name,
        },
        "unlimited": rule.unlimited,
        "shadow_mode": rule.shadow_mode,
        "quota_mode": rule.quota_mode,
        "metadata": None if rule.metadata is None else dict(rule.metadata),
        "source": str(rule.source) if rule.source else None,
    }


def rules_view(rules: RuleSet) -> dict[str, object]:
    domains = {name: [rule_view(r) for r in d.rules()] for name, d in rules.domains.items()}
    return {"version": rules.version, "domains": domains}


class Endpoints:
    """Builds the routes from live objects; every view reads, none writes."""

    def __init__(
        self,
        get_rules: Callable[[], RuleSet],
        limiter: Limiter,
        sync: StoreStatus,
        mode: str,
        *,
        show_values: bool = False,
        overrides: Callable[[bool], dict[str, object]] | None = None,
        source: Callable[[], dict[str, object]] | None = None,
    ) -> None:
        self._get_rules = get_rules
        self._limiter = limiter
        self._sync = sync
        self._mode = mode
        self._show_values = show_values
        self._overrides = overrides  # the runtime overrides in force (overrides/keeper.py)
        self._source = source  # where the rules come from, and whether they have arrived
        self.serving = True  # False from SIGTERM on: load balancers stop sending before the drain

    def routes(self, metrics: Route | None = None) -> dict[str, Route]:
        routes: dict[str, Route] = {
            "/healthz": lambda _q: text_reply("ok\n"),
            "/healthcheck": lambda _q: self.healthcheck(),
            "/readyz": lambda _q: self.ready(),
            "/debug/rules": lambda _q: json_reply(self.rules_view()),
            "/debug/keys": self.keys,
        }
        if metrics is not None:
            routes["/metrics"] = metrics
        return routes

    def rules_view(self) -> dict[str, object]:
        view = rules_view(self._rules())
        if self._source is not None:
            view["source"] = self._source()
        if self._overrides is not None:
            view["overrides"] = self._overrides(self._show_values)
        return view

    def _rules(self) -> RuleSet:
        return self._get_rules()

    def _source_view(self) -> dict[str, object]:
        return self._source() if self._source is not None else {"ready": True}

    def healthcheck(self) -> Reply:
        """The reference's probe: OK while serving and rules have arrived, else 500."""
        healthy = self.serving and bool(self._source_view()["ready"])
        return text_reply("OK") if healthy else text_reply("", 500)

    def ready(self) -> Reply:
        """Ready once rules are loaded (from xDS: once the first configuration arrived); the
        store's state is reported, not required (fail open)."""
        source = self._source_view()
        ready = bool(source["ready"])
        return json_reply(
            {
                "ready": ready,
                "config_version": self._rules().version,
                "config_source": source,
                "mode": self._mode,
                "store_up": self._sync.store_up,
                "store_error": self._sync.last_error,
                "store_key_errors": self._sync.key_errors,
                "heartbeat_error": self._sync.heartbeat_error,
            },
            200 if ready else 503,
        )

    def keys(self, query: dict[str, list[str]]) -> Reply:
        try:
            count = int(query.get("limit", [DEFAULT_KEYS])[0])
        except ValueError:
            return text_reply("limit must be an integer\n", 400)
        states = self._limiter.keys.busiest(max(0, min(count, MAX_KEYS_SHOWN)))
        views = [self._view(s.key, s.snapshot()) for s in states]
        return json_reply({"tracked": len(self._limiter.keys), "keys": views})

    def _view(self, key: KeyId, snapshot: dict[str, object]) -> dict[str, object]:
        """Descriptor values are often API keys or addresses: by default each shows as a digest
        (`#` and 12 hex digits, the same for the same value), and the key as its Redis tag."""
        snapshot["digest"] = digest(key)
        if not self._show_values:
            domain, *pairs = key
            hidden = [part if i % 2 == 0 else value_digest(part) for i, part in enumerate(pairs)]
            snapshot["key"] = [domain, *hidden]
        return snapshot

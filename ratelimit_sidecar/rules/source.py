"""Where a sidecar's rules come from: the rule files (watched), or an xDS control plane."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry

from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.config.limits import ConfigLimits
from ratelimit_sidecar.config.model import RuleSet
from ratelimit_sidecar.rules.reload import RuleWatcher


class RuleSource(Protocol):
    """Hands each new good rule set to `on_rules` until stopped; `view` says where from and
    whether rules have arrived (`ready`)."""

    async def run(self) -> None: ...

    def stop(self) -> None: ...

    def view(self) -> dict[str, object]: ...


def rule_source(
    settings: Settings,
    on_rules: Callable[[RuleSet], None],
    on_error: Callable[[str], None],
    registry: CollectorRegistry,
) -> RuleSource:
    if settings.xds_url is None:
        return RuleWatcher(
            settings.config_path,
            on_rules,
            on_error,
            settings.reload_poll_s,
            ConfigLimits.of(settings),
            defaults=settings.rule_defaults,
        )
    # Imported here: the xDS stubs load only in a sidecar that uses them.
    from ratelimit_sidecar.rules.xds_client import XdsRuleSource

    return XdsRuleSource(settings, on_rules, on_error, registry)

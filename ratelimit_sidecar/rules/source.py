"""Where a sidecar's rules come from: the rule files (watched), or an xDS control plane."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from prometheus_client import CollectorRegistry

from ratelimit_sidecar.config.model import RuleSet
from ratelimit_sidecar.rules.reload import RuleLoading, RuleWatcher
from ratelimit_sidecar.rules.xds_channel import XdsOptions


class RuleSource(Protocol):
    """Hands each new good rule set to `on_rules` until stopped; `view` says where from and
    whether rules have arrived (`ready`)."""

    async def run(self) -> None: ...

    def stop(self) -> None: ...

    def view(self) -> dict[str, object]: ...


def rule_source(
    path: str,
    xds: XdsOptions | None,
    loading: RuleLoading,
    *,
    on_rules: Callable[[RuleSet], None],
    on_error: Callable[[str], None],
    registry: CollectorRegistry,
) -> RuleSource:
    """The control plane of `xds` when given, else the rule file or directory at `path`."""
    if xds is None:
        return RuleWatcher(
            path, on_rules, on_error, loading.poll_s, loading.limits, defaults=loading.defaults
        )
    # Imported here: the xDS stubs load only in a sidecar that uses them.
    from ratelimit_sidecar.rules.xds_client import XdsRuleSource

    return XdsRuleSource(xds, loading, on_rules, on_error, registry=registry)

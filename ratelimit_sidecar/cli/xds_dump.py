"""`ratelimit-sidecar xds-dump URL`: what an xDS control plane serves this node, as rule YAML.

It subscribes like `serve --config-xds URL` would (same node id, metadata and TLS options, same
`RLS_*` or reference variables), takes the first response and prints each `RateLimitConfig` as
a rule file in the reference's format, separated by `---`. Problems `serve` would NACK the
response for go to stderr, and the exit status is then 1. It never ACKs: the control plane sees
a subscription that went away.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from typing import Any

from ratelimit_sidecar._proto.envoy.service.discovery.v3 import discovery_pb2
from ratelimit_sidecar.app.flags import settings_from
from ratelimit_sidecar.app.options import rule_loading, xds_options
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.config.errors import ConfigError
from ratelimit_sidecar.config.xds_rules import (
    RESOURCE_TYPE,
    config_yaml,
    problem_text,
    rules_from_configs,
    unpack,
)
from ratelimit_sidecar.rules.xds_channel import node_of, open_channel
from ratelimit_sidecar.rules.xds_client import ads_stub


def run_xds_dump(url: str, values: Mapping[str, Any], timeout_s: float) -> int:
    settings = settings_from({**values, "config_xds": url})
    try:
        response = asyncio.run(asyncio.wait_for(fetch(settings), timeout_s))
    except TimeoutError:
        print(f"xds-dump: no response from {url} within {timeout_s:g} s", file=sys.stderr)
        return 1
    except Exception as exc:  # unreachable, TLS refused, unreadable files: say which
        print(f"xds-dump: {url}: {exc}", file=sys.stderr)
        return 1
    return show(response, settings)


async def fetch(settings: Settings) -> discovery_pb2.DiscoveryResponse:
    """The control plane's first response to a wildcard subscription for `RateLimitConfig`."""
    xds = xds_options(settings)
    async with open_channel(xds.url, xds.tls) as channel:
        call = ads_stub(channel).StreamAggregatedResources()
        request = discovery_pb2.DiscoveryRequest(node=node_of(xds), type_url=RESOURCE_TYPE)
        await call.write(request)
        response = await call.read()
        call.cancel()
    if not isinstance(response, discovery_pb2.DiscoveryResponse):
        raise ConnectionError("the control plane closed the stream without a response")
    return response


def show(response: discovery_pb2.DiscoveryResponse, settings: Settings) -> int:
    try:
        configs = unpack(response.resources)
    except ConfigError as exc:
        print(f"xds-dump: {problem_text(exc.problems)}", file=sys.stderr)
        return 1
    print(f"# version {response.version_info}: {len(configs)} RateLimitConfig resources")
    for config in configs:
        print(f"---\n# resource '{config.name}'\n{config_yaml(config)}", end="")
    try:
        loading = rule_loading(settings)
        rules_from_configs(configs, loading.limits, loading.defaults)
    except ConfigError as exc:
        print(f"xds-dump: serve would refuse it: {problem_text(exc.problems)}", file=sys.stderr)
        return 1
    return 0

"""`ratelimit-sidecar serve`: load, start, run until SIGTERM/SIGINT, exit with a clear status."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from types import MappingProxyType
from typing import Any

from ratelimit_sidecar.app.builder import server_tls
from ratelimit_sidecar.app.options import rule_loading
from ratelimit_sidecar.app.settings import REUSE_PORT_ENV, Settings
from ratelimit_sidecar.app.sidecar import Sidecar
from ratelimit_sidecar.app.workers import run_workers
from ratelimit_sidecar.bind import BindError
from ratelimit_sidecar.config.errors import ConfigError
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.config.model import RuleSet
from ratelimit_sidecar.grpc_server.tls import TlsError
from ratelimit_sidecar.logs import setup_logging
from ratelimit_sidecar.storage.base import Storage

log = logging.getLogger("ratelimit_sidecar.server")


def fail(message: str) -> int:
    print(f"ratelimit-sidecar: error: {message}", file=sys.stderr)
    return 1


def run_serve(settings: Settings) -> int:
    setup_logging(settings.log_format, settings.log_level)
    try:
        rules = first_rules(settings)
    except ConfigError as exc:
        return fail(f"invalid configuration:\n{exc}")
    except OSError as exc:
        return fail(f"cannot read configuration {settings.config_path}: {exc.strerror}")
    try:
        server_tls(settings)  # a bad TLS file stops the start here, before any worker
    except TlsError as exc:
        return fail(str(exc))
    if settings.workers > 1:
        return run_workers(settings)
    reuse_port = os.environ.get(REUSE_PORT_ENV) == "1"
    return run_async(lambda: serve(settings, rules, reuse_port))


def first_rules(settings: Settings) -> RuleSet:
    """The rule files' rules; none yet when they come from xDS (the stream brings them)."""
    if settings.xds_url is not None:
        return RuleSet(MappingProxyType({}))
    loading = rule_loading(settings)
    return load_rules(settings.config_path, loading.limits, defaults=loading.defaults)


def run_async(factory: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run on uvloop when it is installed, else on the default asyncio loop."""
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(factory())


async def serve(settings: Settings, rules: RuleSet, reuse_port: bool = False) -> int:
    try:
        storage = open_storage(settings)
    except ValueError as exc:
        return fail(str(exc))
    try:
        tls = server_tls(settings)
    except TlsError as exc:  # replaced between the check at start and this worker's start
        return fail(str(exc))
    sidecar = Sidecar(settings, rules, storage, reuse_port=reuse_port, tls=tls)
    try:
        await sidecar.serve()
    except BindError as exc:
        if storage is not None:
            await storage.close()
        return fail(str(exc))
    return 0


def open_storage(settings: Settings) -> Storage | None:
    """The Redis store for `--redis-url`, or None (local-only) without one."""
    if settings.local_only:
        return None
    from ratelimit_sidecar.storage.redis_urls import open_redis

    return open_redis(settings.redis_url or "", settings.redis_prefix, settings.node_id)

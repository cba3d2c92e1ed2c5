"""Command line: `serve`, `check`, `simulate`. Each serve flag has an RLS_* environment variable."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from ratelimit_sidecar.settings import ENV_PREFIX, Settings, default_node_id

log = logging.getLogger("ratelimit_sidecar.cli")

# flag, env suffix, type, default, help
_SERVE_FLAGS: list[tuple[str, type, Any, str]] = [
    ("--config", str, None, "rule YAML file or directory (envoyproxy/ratelimit format)"),
    ("--redis-url", str, None, "redis:// rediss:// unix:// URL; omit for a single local node"),
    ("--grpc-address", str, "127.0.0.1:8081", "host:port for ShouldRateLimit"),
    ("--metrics-address", str, "127.0.0.1:9090", "host:port for /metrics, /healthz, /readyz"),
    ("--node-id", str, None, "this node's id (default: hostname-pid)"),
    ("--workers", int, 1, "processes sharing the gRPC port (SO_REUSEPORT)"),
    ("--log-format", str, "text", "text or json"),
    ("--log-level", str, "info", "debug, info, warning or error"),
    ("--max-keys", int, 100_000, "bound on tracked keys"),
    ("--redis-prefix", str, "rls:", "prefix of every Redis key"),
    ("--sync-timeout-ms", int, 250, "Redis timeout per sync (capped at half a span)"),
]
_SERVE_SWITCHES = [
    ("--shadow-mode", "count and report, never answer OVER_LIMIT"),
    ("--ietf-headers", "add RateLimit-Policy / RateLimit response headers"),
]


def env_name(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def _env_bool(flag: str) -> bool:
    return os.environ.get(env_name(flag), "").lower() in {"1", "true", "yes", "on"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ratelimit-sidecar", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the rate limit service")
    for flag, kind, default, text in _SERVE_FLAGS:
        value = os.environ.get(env_name(flag), default)
        serve.add_argument(flag, type=kind, default=value, help=f"{text} [{env_name(flag)}]")
    for flag, text in _SERVE_SWITCHES:
        serve.add_argument(flag, action="store_true", default=_env_bool(flag), help=text)
    check = commands.add_parser("check", help="validate rule files")
    check.add_argument("path")
    simulate = commands.add_parser("simulate", help="accuracy simulator", add_help=False)
    simulate.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(
        config_path=args.config,
        redis_url=args.redis_url or None,
        grpc_address=args.grpc_address,
        metrics_address=args.metrics_address,
        node_id=args.node_id or default_node_id(),
        workers=args.workers,
        shadow_mode=args.shadow_mode,
        log_format=args.log_format,
        log_level=args.log_level,
        ietf_headers=args.ietf_headers,
        max_keys=args.max_keys,
        redis_prefix=args.redis_prefix,
        sync_timeout_ms=args.sync_timeout_ms,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"]:  # its own parser: argparse.REMAINDER would reject --flags
        from ratelimit_sidecar.simulate.cli import main as simulate_main

        return int(simulate_main(argv[1:]))
    args = build_parser().parse_args(argv)
    if args.command == "check":
        from ratelimit_sidecar.cli_check import run_check

        return run_check(args.path)
    if not args.config:
        print("ratelimit-sidecar: error: --config (or RLS_CONFIG) is required", file=sys.stderr)
        return 2
    # gRPC's C core logs its own copy of startup errors we already report in one line.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    from ratelimit_sidecar.server.run import run_serve

    return run_serve(settings_from(args))


def run_async(factory: Callable[[], Coroutine[Any, Any, int]]) -> int:
    """Run on uvloop when it is installed, else on the default asyncio loop."""
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(factory())


if __name__ == "__main__":
    sys.exit(main())

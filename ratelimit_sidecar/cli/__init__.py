"""Command line: `serve`, `check`, `simulate`, `overrides`, `xds-dump`; serve flags have RLS_*
variables."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ratelimit_sidecar.app.flags import OPTIONS, Option, settings_from
from ratelimit_sidecar.app.settings import ENV_PREFIX
from ratelimit_sidecar.config.limits import LIMIT_NAMES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ratelimit-sidecar", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the rate limit service")
    for option in OPTIONS:
        _add_option(serve, option)
    check = commands.add_parser("check", help="validate rule files")
    check.add_argument("path")
    for option in OPTIONS:
        if option.name in LIMIT_NAMES:
            _add_option(check, option)
    dump = commands.add_parser("xds-dump", help="print the rules an xDS control plane serves")
    dump.add_argument("url", help="host:port of the control plane")
    dump.add_argument("--timeout-s", type=float, default=10.0, help="wait at most this long")
    for option in OPTIONS:
        if option.name.startswith(("config_xds_", "max_rule_", "max_yaml_")):
            _add_option(dump, option)
    simulate = commands.add_parser("simulate", help="accuracy simulator", add_help=False)
    simulate.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _add_option(parser: argparse.ArgumentParser, option: Option) -> None:
    """A flag whose default is its environment variable, else None (the Settings default)."""
    env = os.environ.get(option.env) or None  # set but empty: unset (a worker gets every setting)
    shown = f" (default: {option.default_text})" if option.default_text else ""
    text = f"{option.help}{shown} [{option.env}]"
    if option.kind is bool:
        default = False if env is None else option.parse(env)
        parser.add_argument(
            option.flag, dest=option.name, action="store_true", default=default, help=text
        )
    else:  # argparse converts a string default with `type`, so a bad variable is a usage error
        metavar = option.env.removeprefix(ENV_PREFIX)
        parser.add_argument(
            option.flag, dest=option.name, type=option.kind, default=env, metavar=metavar, help=text
        )


def _simulate(argv: list[str]) -> int:
    """The accuracy simulator lives beside the package in a checkout (`python -m simulator`),
    not in the wheel: found there, or the command says where to get it."""
    checkout = Path(__file__).resolve().parents[2]  # ratelimit_sidecar/cli/__init__.py
    if (checkout / "simulator").is_dir() and str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    try:
        simulator = importlib.import_module("simulator.cli")
    except ImportError:
        print("ratelimit-sidecar: simulate runs from a source checkout", file=sys.stderr)
        return 2
    return int(simulator.main(argv))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"]:  # its own parser: argparse.REMAINDER would reject --flags
        return _simulate(argv[1:])
    if argv[:1] == ["overrides"]:  # a client of the admin API: its own parser
        from ratelimit_sidecar.cli.overrides import main as overrides_main

        return overrides_main(argv[1:])
    args = vars(build_parser().parse_args(argv))
    command = args.pop("command")
    if command == "xds-dump":
        from ratelimit_sidecar.cli.xds_dump import run_xds_dump

        return run_xds_dump(args.pop("url"), args, args.pop("timeout_s"))
    if command == "check":
        from ratelimit_sidecar.cli.check import limits_from, run_check

        return run_check(args["path"], limits_from(args))
    # gRPC's C core logs its own copy of startup errors we already report in one line.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    from ratelimit_sidecar.app.run import run_serve

    try:
        settings = settings_from(args)
    except ValueError as exc:  # a value no flag type can rule out (e.g. an unknown algorithm)
        print(f"ratelimit-sidecar: error: {exc}", file=sys.stderr)
        return 2
    return run_serve(settings)


if __name__ == "__main__":
    sys.exit(main())

"""`ratelimit-sidecar overrides list|get|set|delete|history|rollback`: the admin API for scripts.

The token comes from the environment (`RLS_ADMIN_TOKEN`), never from the command line, where
`ps` would show it. Answers are printed as JSON on stdout; errors as the API's JSON error on
stderr. Exit codes: 0 done, 1 refused (400, 404, 405, 409, 413), 2 usage, 3 the sidecar cannot
be reached or its store is down (503), 4 unauthorized (401).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

from ratelimit_sidecar.app.settings import DEFAULT_ADMIN_ADDRESS
from ratelimit_sidecar.http_server.admin_token import ADMIN_TOKEN_ENV

URL_ENV = "RLS_ADMIN_URL"
DEFAULT_URL = f"http://{DEFAULT_ADMIN_ADDRESS}"
TIMEOUT_S = 10.0
EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_UNAUTHORIZED = 1, 2, 3, 4


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ratelimit-sidecar overrides",
        description=f"Runtime overrides through the admin API (token from {ADMIN_TOKEN_ENV}).",
    )
    parser.add_argument(
        "--admin-url",
        default=os.environ.get(URL_ENV, DEFAULT_URL),
        help=f"the sidecar's admin address (default: {DEFAULT_URL}) [{URL_ENV}]",
    )
    commands = parser.add_subparsers(dest="action", required=True)
    listing = commands.add_parser("list", help="the overrides and the set's version")
    listing.add_argument("--domain", help="only this domain's")
    commands.add_parser("get", help="one override").add_argument("id")
    commands.add_parser("delete", help="remove one override").add_argument("id")
    commands.add_parser("history", help="the last 100 changes")
    rollback = commands.add_parser("rollback", help="make the set as at VERSION current")
    rollback.add_argument("version", type=int)
    put = commands.add_parser("set", help="create or replace the override of a descriptor")
    put.add_argument("--file", help="the JSON body, from a file ('-': stdin)")
    put.add_argument("--domain")
    put.add_argument(
        "--entry",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="descriptor entry, in order",
    )
    put.add_argument("--rate-limit", metavar="JSON", help='e.g. \'{"unit": "minute", ...}\'')
    put.add_argument("--expires-at", metavar="RFC3339", help="e.g. 2026-12-01T00:00:00Z")
    put.add_argument("--note")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    token = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if not token:
        print(f"ratelimit-sidecar overrides: error: set {ADMIN_TOKEN_ENV}", file=sys.stderr)
        return EXIT_USAGE
    try:
        method, path, body = _call(args)
    except ValueError as exc:
        print(f"ratelimit-sidecar overrides: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _send(args.admin_url.rstrip("/") + path, method, body, token)


def _call(args: argparse.Namespace) -> tuple[str, str, object]:
    """(method, path, JSON body or None) of the chosen action."""
    action = args.action
    if action == "list":
        query = "" if not args.domain else "?" + urllib.parse.urlencode({"domain": args.domain})
        return "GET", "/v1/overrides" + query, None
    if action in ("get", "delete"):
        quoted = urllib.parse.quote(args.id, safe="")
        return ("GET" if action == "get" else "DELETE"), f"/v1/overrides/{quoted}", None
    if action == "history":
        return "GET", "/v1/overrides/history", None
    if action == "rollback":
        return "POST", "/v1/overrides/rollback", {"version": args.version}
    return "PUT", "/v1/overrides", _set_body(args)


def _set_body(args: argparse.Namespace) -> object:
    if args.file:
        text = sys.stdin.read() if args.file == "-" else _read(args.file)
        return json.loads(text)
    if not (args.domain and args.entry and args.rate_limit):
        raise ValueError("set needs --file, or --domain, --entry KEY=VALUE and --rate-limit JSON")
    entries = []
    for entry in args.entry:
        key, equals, value = entry.partition("=")
        if not equals:
            raise ValueError(f"--entry {entry!r}: expected KEY=VALUE")
        entries.append({"key": key, "value": value})
    body: dict[str, object] = {
        "domain": args.domain,
        "descriptor": entries,
        "rate_limit": json.loads(args.rate_limit),
    }
    if args.expires_at:
        body["expires_at"] = args.expires_at
    if args.note:
        body["note"] = args.note
    return body


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as file:
        return file.read()


def _send(url: str, method: str, body: object, token: str) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            sys.stdout.write(response.read().decode())
            return 0
    except urllib.error.HTTPError as error:
        sys.stderr.write(error.read().decode(errors="replace"))
        if error.code == 401:
            return EXIT_UNAUTHORIZED
        return EXIT_UNAVAILABLE if error.code >= 500 else EXIT_REFUSED
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        print(f"ratelimit-sidecar overrides: cannot reach {url}: {reason}", file=sys.stderr)
        return EXIT_UNAVAILABLE

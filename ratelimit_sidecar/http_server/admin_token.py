"""The admin API's bearer token: read from a file, else from `RLS_ADMIN_TOKEN`.

Never a setting, so that it shows in no command line, log or repr (docs/OVERRIDES.md). Light on
purpose: the `overrides` client (cli/overrides.py) imports the variable's name from here.
"""

from __future__ import annotations

import os

from ratelimit_sidecar.bind import BindError

ADMIN_TOKEN_ENV = "RLS_ADMIN_TOKEN"  # the settings' prefix, but never a flag
MAX_TOKEN_BYTES = 4096


def admin_token_configured(token_file: str | None) -> bool:
    """Whether a token is configured (read or not): `token_file`, else the variable."""
    return bool(token_file or os.environ.get(ADMIN_TOKEN_ENV, "").strip())


def admin_token(token_file: str | None) -> bytes | None:
    """The configured token, or None (the admin API stays closed). Raises BindError if the
    token file cannot be read: an operator who named one expects the API."""
    if token_file:
        return _token_from_file(token_file)
    token = os.environ.get(ADMIN_TOKEN_ENV, "").strip().encode()
    return token or None


def _token_from_file(token_file: str) -> bytes:
    try:
        with open(token_file, "rb") as file:
            token = file.read(MAX_TOKEN_BYTES).strip()
    except OSError as exc:
        raise BindError(f"cannot read --admin-token-file: {exc.strerror}") from exc
    if not token:
        raise BindError("--admin-token-file is empty")
    return token

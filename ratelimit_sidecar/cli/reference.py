"""`ratelimit`: the sidecar configured by envoyproxy/ratelimit's environment variables.

Deployments written for the reference service (Istio's sample, Envoy Gateway, Helm charts) set
its variables and run `/bin/ratelimit`. This command reads them, turns each into a setting of
this sidecar, and runs `serve`. An `RLS_*` variable or a flag wins over the reference variable it
would come from. A variable that would change behaviour this sidecar does not have stops the
start with a message naming it; one that is harmless here is logged once as ignored, with why.
docs/REFERENCE.md lists every variable and what it does here.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from ratelimit_sidecar.app.flags import OPTIONS
from ratelimit_sidecar.cli import reference_xds as xds
from ratelimit_sidecar.cli.reference_ignored import IGNORED

log = logging.getLogger("ratelimit_sidecar.reference")

# The reference's own defaults: it listens on every interface.
DEFAULTS = {
    "HOST": "0.0.0.0",
    "PORT": "8080",
    "GRPC_HOST": "0.0.0.0",
    "GRPC_PORT": "8081",
    "DEBUG_PORT": "6070",
    "RUNTIME_ROOT": "/srv/runtime_data/current",
    "RUNTIME_APPDIRECTORY": "config",
    "LOG_LEVEL": "WARN",
    "REDIS_SOCKET_TYPE": "unix",
    "REDIS_TYPE": "SINGLE",
    "PROMETHEUS_ADDR": ":9090",
}
_LOG_LEVELS = {"trace": "debug", "debug": "debug", "info": "info", "warn": "warning",
               "warning": "warning", "error": "error", "fatal": "error",
               "panic": "error"}  # fmt: skip
_TRUE = frozenset({"1", "t", "true"})  # Go's strconv.ParseBool, case-insensitive as it is
_FALSE = frozenset({"0", "f", "false"})
_SWITCHES = {"SHADOW_MODE": "shadow_mode", "QUOTA_MODE": "quota_mode",
             "RESPONSE_DYNAMIC_METADATA": "response_dynamic_metadata"}  # fmt: skip
_RATIOS = {"NEAR_LIMIT_RATIO": "near_limit_ratio"}
_TRACING = {"TRACING_ENABLED": "tracing", "TRACING_SERVICE_NAME": "tracing_service_name",
            "TRACING_SERVICE_NAMESPACE": "tracing_service_namespace",
            "TRACING_EXPORTER_PROTOCOL": "tracing_protocol",
            "TRACING_SAMPLING_RATE": "tracing_sampling_ratio"}  # fmt: skip
_TLS = {"GRPC_SERVER_TLS_CERT": "grpc_tls_cert", "GRPC_SERVER_TLS_KEY": "grpc_tls_key",
        "GRPC_CLIENT_TLS_CACERT": "grpc_tls_client_ca",
        "GRPC_CLIENT_TLS_SAN": "grpc_tls_client_san"}  # fmt: skip

# Read by the reference only with another variable set; harmless here without it.
_ONLY_WITH_PREFIXES = {"MEMCACHE_": "BACKEND_TYPE=memcache"}
_PER_SECOND = "per-second limits share the one Redis of REDIS_URL"
# Every variable the translation reads (mapped, checked or refused), besides those above.
READ = frozenset({
    *DEFAULTS, "DEBUG_HOST", "RUNTIME_SUBDIRECTORY", "LOG_FORMAT", "REDIS_URL", "REDIS_AUTH",
    "REDIS_TLS", "REDIS_TLS_CACERT", "REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "REDIS_SENTINEL_AUTH", "USE_PROMETHEUS",
    "CACHE_KEY_PREFIX", *_TLS, *_TRACING, *_RATIOS, "SHADOW_MODE",
    "GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE", "QUOTA_MODE",
    "RESPONSE_DYNAMIC_METADATA",
    "BACKEND_TYPE", "GRPC_UDS", "CONFIG_TYPE", "GRPC_SERVER_USE_TLS", "MERGE_DOMAIN_CONFIG",
    "LIMIT_RESPONSE_HEADERS_ENABLED", "LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER", *xds.XDS_READ,
})  # fmt: skip


def known(name: str) -> bool:
    """True for a reference variable this command reads, ignores or refuses."""
    prefixes = (*_ONLY_WITH_PREFIXES, "REDIS_PERSECOND")
    ignored = name in IGNORED or name in xds.XDS_IGNORED
    return name in READ or ignored or name.startswith(prefixes)


class ReferenceEnvError(ValueError):
    """A reference variable this sidecar cannot honour; the message names it."""


@dataclass(frozen=True)
class Translation:
    """The `RLS_*` variables the reference's environment stands for, and what was ignored."""

    variables: dict[str, str]
    ignored: tuple[str, ...]  # "NAME: why", one per ignored variable that is set


def translate(env: Mapping[str, str]) -> Translation:
    """Raises ReferenceEnvError for a variable that would change behaviour and cannot here."""
    _refuse_unsupported(env)
    settings = {
        **_addresses(env),
        **_rules(env),
        **_xds(env),
        **_redis(env),
        **_logging(env),
        **_tls(env),
        **_connection_age(env),
        **_tracing(env),
        **_response_headers(env),
        **{field: env[name] for name, field in _RATIOS.items() if env.get(name)},
        **{field: str(_flag(env, name)) for name, field in _SWITCHES.items() if name in env},
    }
    variables = {_variable(field): value for field, value in settings.items()}
    return Translation(variables, _ignored(env))


def _get(env: Mapping[str, str], name: str) -> str:
    return env.get(name, DEFAULTS.get(name, ""))


def _flag(env: Mapping[str, str], name: str) -> bool:
    text = env.get(name, "false").strip().lower()
    if text not in _TRUE | _FALSE:
        raise ReferenceEnvError(f"{name}={env[name]!r} is not a boolean (true or false)")
    return text in _TRUE


def _variable(field: str) -> str:
    """The RLS_* variable of a Settings field (a typo here fails every test)."""
    return next(option.env for option in OPTIONS if option.name == field)


def _address(host: str, port: str, name: str) -> str:
    if not port.isdigit():
        raise ReferenceEnvError(f"{name}={port!r} is not a port number")
    host = host or "0.0.0.0"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _addresses(env: Mapping[str, str]) -> dict[str, str]:
    """gRPC on GRPC_HOST:GRPC_PORT; the reference's HTTP port (HOST:PORT) serves the health
    endpoints; /metrics goes to PROMETHEUS_ADDR with USE_PROMETHEUS; the debug endpoints to
    DEBUG_PORT, on loopback unless DEBUG_HOST says otherwise."""
    found = {
        "grpc_address": _address(_get(env, "GRPC_HOST"), _get(env, "GRPC_PORT"), "GRPC_PORT"),
        "health_address": _address(_get(env, "HOST"), _get(env, "PORT"), "PORT"),
        "debug_address": _address(
            env.get("DEBUG_HOST", "127.0.0.1"), _get(env, "DEBUG_PORT"), "DEBUG_PORT"
        ),
    }
    if _flag(env, "USE_PROMETHEUS"):
        host, _, port = _get(env, "PROMETHEUS_ADDR").rpartition(":")
        found["metrics_address"] = _address(host.strip("[]"), port, "PROMETHEUS_ADDR")
    return found


def _rules(env: Mapping[str, str]) -> dict[str, str]:
    """The reference reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY."""
    parts = [_get(env, "RUNTIME_ROOT"), env.get("RUNTIME_SUBDIRECTORY", "")]
    parts.append(_get(env, "RUNTIME_APPDIRECTORY"))
    return {"config_path": os.path.join(*(part for part in parts if part))}


def _xds(env: Mapping[str, str]) -> dict[str, str]:
    try:
        return xds.xds_settings(env, _flag)
    except ValueError as exc:  # a ReferenceEnvError from _flag, or the same said there
        raise ReferenceEnvError(str(exc)) from exc


def _logging(env: Mapping[str, str]) -> dict[str, str]:
    level = _get(env, "LOG_LEVEL")
    if level.lower() not in _LOG_LEVELS:
        raise ReferenceEnvError(f"LOG_LEVEL={level!r}: use debug, info, warn or error")
    found = {"log_level": _LOG_LEVELS[level.lower()]}
    if "LOG_FORMAT" in env:
        if env["LOG_FORMAT"] not in ("text", "json"):
            raise ReferenceEnvError(f"LOG_FORMAT={env['LOG_FORMAT']!r}: use text or json")
        found["log_format"] = env["LOG_FORMAT"]
    return found


def _redis(env: Mapping[str, str]) -> dict[str, str]:
    """REDIS_URL with REDIS_SOCKET_TYPE, REDIS_TYPE, REDIS_AUTH and REDIS_TLS* as one URL.
    Unset, the sidecar runs as a single node: the reference's default socket is twemproxy's,
    which cannot run the sync's scripts."""
    found = {} if "CACHE_KEY_PREFIX" not in env else {"redis_prefix": env["CACHE_KEY_PREFIX"]}
    if not env.get("REDIS_URL"):
        return found
    kind, socket_type = _get(env, "REDIS_TYPE").upper(), _get(env, "REDIS_SOCKET_TYPE").lower()
    if socket_type not in ("tcp", "unix"):
        raise ReferenceEnvError(f"REDIS_SOCKET_TYPE={socket_type!r}: use tcp or unix")
    builders = {"SINGLE": _single_url, "CLUSTER": _cluster_url, "SENTINEL": _sentinel_url}
    if kind not in builders:
        raise ReferenceEnvError(f"REDIS_TYPE={kind!r}: use SINGLE, CLUSTER or SENTINEL")
    if socket_type == "unix" and kind != "SINGLE":
        raise ReferenceEnvError(f"REDIS_SOCKET_TYPE=unix goes with REDIS_TYPE=SINGLE, not {kind}")
    return {**found, "redis_url": builders[kind](env, socket_type)}


def _credentials(env: Mapping[str, str]) -> str:
    """REDIS_AUTH is a password, or `user:password`."""
    auth = env.get("REDIS_AUTH", "")
    if not auth:
        return ""
    user, colon, password = auth.partition(":")
    user, password = (user, password) if colon else ("", user)
    return f"{quote(user, safe='')}:{quote(password, safe='')}@"


def _scheme(env: Mapping[str, str], suffix: str = "") -> str:
    return ("rediss" if _flag(env, "REDIS_TLS") else "redis") + suffix + "://"


def _tls_query(env: Mapping[str, str], more: dict[str, str] | None = None) -> str:
    query = dict(more or {})
    files = {"REDIS_TLS_CACERT": "ssl_ca_certs", "REDIS_TLS_CLIENT_CERT": "ssl_certfile",
             "REDIS_TLS_CLIENT_KEY": "ssl_keyfile"}  # fmt: skip
    if _flag(env, "REDIS_TLS"):
        query.update({param: env[name] for name, param in files.items() if env.get(name)})
        if _flag(env, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"):
            query["ssl_check_hostname"] = "false"
    return "?" + urlencode(query) if query else ""


def _single_url(env: Mapping[str, str], socket_type: str) -> str:
    url = env["REDIS_URL"]
    if socket_type == "unix":
        return f"unix://{_credentials(env)}{url}"
    return f"{_scheme(env)}{_credentials(env)}{url}{_tls_query(env)}"


def _cluster_url(env: Mapping[str, str], _socket_type: str) -> str:
    return f"{_scheme(env, '+cluster')}{_credentials(env)}{env['REDIS_URL']}{_tls_query(env)}"


def _sentinel_url(env: Mapping[str, str], _socket_type: str) -> str:
    """The reference's form: `master_name,sentinel1:port,sentinel2:port`."""
    name, _, sentinels = env["REDIS_URL"].partition(",")
    if not sentinels:
        raise ReferenceEnvError("REDIS_URL for SENTINEL is master_name,host:port[,host:port...]")
    auth = (
        {"sentinel_password": env["REDIS_SENTINEL_AUTH"]} if env.get("REDIS_SENTINEL_AUTH") else {}
    )
    query = _tls_query(env, auth)
    return f"{_scheme(env, '+sentinel')}{_credentials(env)}{sentinels}/{name}{query}"


def _tls(env: Mapping[str, str]) -> dict[str, str]:
    """GRPC_SERVER_USE_TLS: the gRPC port over TLS; a client CA makes it mTLS."""
    if not _flag(env, "GRPC_SERVER_USE_TLS"):
        return {}
    for name in ("GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY"):
        if not env.get(name):
            raise ReferenceEnvError(f"GRPC_SERVER_USE_TLS=true needs {name}")
    return {field: env[name] for name, field in _TLS.items() if env.get(name)}


def _connection_age(env: Mapping[str, str]) -> dict[str, str]:
    """GRPC_MAX_CONNECTION_AGE (+ _GRACE), Go durations, the reference's 24h and 1h unset."""
    try:
        age = xds.go_seconds(env.get("GRPC_MAX_CONNECTION_AGE", "24h"), "GRPC_MAX_CONNECTION_AGE")
        grace_text = env.get("GRPC_MAX_CONNECTION_AGE_GRACE", "1h")
        grace = xds.go_seconds(grace_text, "GRPC_MAX_CONNECTION_AGE_GRACE")
    except ValueError as exc:
        raise ReferenceEnvError(str(exc)) from exc
    return {"grpc_max_connection_age_s": str(age), "grpc_max_connection_age_grace_s": str(grace)}


_HEADER_NAMES = {"LIMIT_LIMIT_HEADER": "RateLimit-Limit",
                 "LIMIT_REMAINING_HEADER": "RateLimit-Remaining",
                 "LIMIT_RESET_HEADER": "RateLimit-Reset"}  # fmt: skip


def _response_headers(env: Mapping[str, str]) -> dict[str, str]:
    """LIMIT_RESPONSE_HEADERS_ENABLED, its header names renamed by LIMIT_*_HEADER."""
    if not _flag(env, "LIMIT_RESPONSE_HEADERS_ENABLED"):
        return {}
    names = ",".join(env.get(name) or default for name, default in _HEADER_NAMES.items())
    return {"limit_response_headers": "true", "limit_response_header_names": names}


def _tracing(env: Mapping[str, str]) -> dict[str, str]:
    """TRACING_*: OTLP traces; the endpoint comes from OTEL_EXPORTER_OTLP_ENDPOINT, as there."""
    if not _flag(env, "TRACING_ENABLED"):
        return {}
    found = {field: env[name] for name, field in _TRACING.items() if env.get(name)}
    found["tracing"] = "true"
    found["tracing_protocol"] = env.get("TRACING_EXPORTER_PROTOCOL", "http").lower()
    return found


def _refuse_unsupported(env: Mapping[str, str]) -> None:
    """Variables that change what the service does, where this sidecar has no counterpart."""
    if env.get("BACKEND_TYPE", "redis").lower() != "redis":
        raise ReferenceEnvError(f"BACKEND_TYPE={env['BACKEND_TYPE']!r}: only redis is supported")
    if env.get("GRPC_UDS"):
        raise ReferenceEnvError("GRPC_UDS: gRPC on a Unix socket is not supported; use GRPC_PORT")
    if env.get("CONFIG_TYPE", "FILE").upper() not in ("FILE", xds.XDS_TYPE):
        raise ReferenceEnvError(f"CONFIG_TYPE={env['CONFIG_TYPE']!r}: use FILE or {xds.XDS_TYPE}")
    for name, why in (("MERGE_DOMAIN_CONFIG", "each domain must be in one rule file"),):
        if _flag(env, name):
            raise ReferenceEnvError(f"{name}=true: {why}")


def _ignored(env: Mapping[str, str]) -> tuple[str, ...]:
    notes = [
        f"{name}: {why}" for name, why in {**IGNORED, **xds.XDS_IGNORED}.items() if name in env
    ]
    notes += xds.xds_unused(env)
    for name in sorted(env):
        gate = next((g for p, g in _ONLY_WITH_PREFIXES.items() if name.startswith(p)), None)
        if gate is not None:
            notes.append(f"{name}: read only with {gate}")
        elif name.startswith("REDIS_PERSECOND"):
            notes.append(f"{name}: {_PER_SECOND}")
    return tuple(notes)


def main(argv: Sequence[str] | None = None) -> int:
    """`ratelimit [serve flags]`: serve, configured from the reference's variables."""
    from ratelimit_sidecar.cli import main as cli_main
    from ratelimit_sidecar.logs import setup_logging

    try:
        translation = translate(os.environ)
    except ReferenceEnvError as exc:
        print(f"ratelimit: error: {exc}", file=sys.stderr)
        return 2
    for name, value in translation.variables.items():
        os.environ.setdefault(name, value)  # RLS_* set by the operator win
    setup_logging(os.environ.get("RLS_LOG_FORMAT", "text"), os.environ["RLS_LOG_LEVEL"])
    for note in translation.ignored:
        log.warning("ignoring %s", note)
    return cli_main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())

"""The `ratelimit` command's part for rules from xDS: CONFIG_TYPE=GRPC_XDS_SOTW and the
reference's CONFIG_GRPC_XDS_* and XDS_CLIENT_* variables as `--config-xds-*` settings.

Raises ValueError (the command reports it as the reference variable it names).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

Flag = Callable[[Mapping[str, str], str], bool]  # the command's reading of a Go boolean

# CONFIG_TYPE=GRPC_XDS_SOTW: rules from an xDS control plane (docs/XDS.md).
XDS_TYPE = "GRPC_XDS_SOTW"
XDS_URL = "localhost:18000"  # the reference's default CONFIG_GRPC_XDS_SERVER_URL
_XDS = {"CONFIG_GRPC_XDS_SERVER_URL": "config_xds", "CONFIG_GRPC_XDS_NODE_ID": "config_xds_node_id",
        "CONFIG_GRPC_XDS_NODE_METADATA": "config_xds_node_metadata",
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "config_xds_client_tls_cert",
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "config_xds_client_tls_key",
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "config_xds_server_tls_cacert",
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN": "config_xds_server_tls_san"}  # fmt: skip
# Durations, Go's syntax: the first delay (the dial retry, or the backoff's start) and the longest.
_XDS_DELAYS = {"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "config_xds_retry_s",
               "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "config_xds_retry_s",
               "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "config_xds_retry_max_s"}  # fmt: skip
XDS_IGNORED = {
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "every delay is drawn from the upper half of its range",
    "XDS_CLIENT_BACKOFF_JITTER": "reconnect delays are always jittered",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "responses up to 64 MiB are accepted",
}
_GO_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# Every variable read here.
XDS_READ = frozenset({
    "CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "FORCE_START_WITHOUT_INITIAL_CONFIG", *_XDS, *_XDS_DELAYS,
})  # fmt: skip


def xds_settings(env: Mapping[str, str], flag: Flag) -> dict[str, str]:
    """CONFIG_TYPE=GRPC_XDS_SOTW: the rules come from the control plane at
    CONFIG_GRPC_XDS_SERVER_URL, as CONFIG_GRPC_XDS_NODE_ID, over TLS with
    CONFIG_GRPC_XDS_SERVER_USE_TLS; without the variables the reference's defaults."""
    if env.get("CONFIG_TYPE", "FILE").upper() != XDS_TYPE:
        return {}
    if env.get("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"):
        raise ValueError("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: not supported")
    found = {field: env[name] for name, field in _XDS.items() if env.get(name)}
    found.setdefault("config_xds", XDS_URL)
    for name, field in _XDS_DELAYS.items():
        if env.get(name):
            found[field] = str(go_seconds(env[name], name))
    if flag(env, "CONFIG_GRPC_XDS_SERVER_USE_TLS"):
        found["config_xds_client_tls"] = "true"
    if flag(env, "FORCE_START_WITHOUT_INITIAL_CONFIG"):
        found["ready_without_config"] = "true"
    return found


def go_seconds(text: str, name: str) -> float:
    """A Go duration of one unit (`3s`, `500ms`, `1m`) in seconds."""
    for suffix in sorted(_GO_UNITS, key=len, reverse=True):
        number = text.removesuffix(suffix)
        if number != text:
            try:
                return float(number) * _GO_UNITS[suffix]
            except ValueError:
                break
    raise ValueError(f"{name}={text!r} is not a duration (like 3s or 500ms)")


def xds_unused(env: Mapping[str, str]) -> list[str]:
    """Notes for the xDS variables set while the rules come from files."""
    if env.get("CONFIG_TYPE", "FILE").upper() == XDS_TYPE:
        return []
    names = sorted(name for name in env if name in XDS_READ or name.startswith("XDS_CLIENT_"))
    return [f"{name}: read only with CONFIG_TYPE={XDS_TYPE}" for name in names]

"""The reference service's environment turned into this sidecar's settings."""

from __future__ import annotations

import pytest

from ratelimit_sidecar.app.flags import OPTIONS
from ratelimit_sidecar.cli.reference import ReferenceEnvError, known, translate
from ratelimit_sidecar.cli.reference_ignored import IGNORED
from ratelimit_sidecar.storage.redis_urls import open_redis

ISTIO_SAMPLE = {  # samples/ratelimit/rate-limit-service.yaml, as Istio ships it
    "LOG_LEVEL": "debug",
    "REDIS_SOCKET_TYPE": "tcp",
    "REDIS_URL": "redis:6379",
    "USE_STATSD": "false",
    "RUNTIME_ROOT": "/data",
    "RUNTIME_SUBDIRECTORY": "ratelimit",
    "RUNTIME_WATCH_ROOT": "false",
    "RUNTIME_IGNOREDOTFILES": "true",
    "HOST": "::",
    "GRPC_HOST": "::",
}


def test_istio_sample() -> None:
    translation = translate(ISTIO_SAMPLE)
    assert translation.variables == {
        "RLS_GRPC_ADDRESS": "[::]:8081",
        "RLS_HEALTH_ADDRESS": "[::]:8080",
        "RLS_DEBUG_ADDRESS": "127.0.0.1:6070",
        "RLS_CONFIG": "/data/ratelimit/config",
        "RLS_REDIS_URL": "redis://redis:6379",
        "RLS_LOG_LEVEL": "debug",
        "RLS_GRPC_MAX_CONNECTION_AGE_S": "86400.0",  # the reference's 24 h and 1 h
        "RLS_GRPC_MAX_CONNECTION_AGE_GRACE_S": "3600.0",
    }
    assert translation.ignored == (
        f"USE_STATSD: {IGNORED['USE_STATSD']}",
        f"RUNTIME_WATCH_ROOT: {IGNORED['RUNTIME_WATCH_ROOT']}",
        f"RUNTIME_IGNOREDOTFILES: {IGNORED['RUNTIME_IGNOREDOTFILES']}",
    )


def test_the_references_defaults_listen_everywhere_and_read_its_runtime_path() -> None:
    variables = translate({}).variables
    assert variables["RLS_GRPC_ADDRESS"] == "0.0.0.0:8081"
    assert variables["RLS_HEALTH_ADDRESS"] == "0.0.0.0:8080"
    assert variables["RLS_CONFIG"] == "/srv/runtime_data/current/config"
    assert variables["RLS_LOG_LEVEL"] == "warning"  # the reference's WARN
    assert "RLS_REDIS_URL" not in variables  # single node rather than twemproxy's socket
    assert "RLS_METRICS_ADDRESS" not in variables


def test_every_translated_variable_is_a_setting() -> None:
    known = {option.env for option in OPTIONS}
    env = {**ISTIO_SAMPLE, "USE_PROMETHEUS": "true", "SHADOW_MODE": "1", "QUOTA_MODE": "T",
           "RESPONSE_DYNAMIC_METADATA": "false", "LOG_FORMAT": "json",
           "CACHE_KEY_PREFIX": "edge:"}  # fmt: skip
    variables = translate(env).variables
    assert set(variables) <= known
    assert variables["RLS_METRICS_ADDRESS"] == "0.0.0.0:9090"
    assert (variables["RLS_SHADOW_MODE"], variables["RLS_QUOTA_MODE"]) == ("True", "True")
    assert variables["RLS_RESPONSE_DYNAMIC_METADATA"] == "False"
    assert (variables["RLS_LOG_FORMAT"], variables["RLS_REDIS_PREFIX"]) == ("json", "edge:")


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({"REDIS_URL": "/run/redis.sock"}, "unix:///run/redis.sock"),
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_AUTH": "p@ss"},
         "redis://:p%40ss@r:6379"),
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "REDIS_AUTH": "bob:s3"},
         "redis://bob:s3@r:6379"),
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6380", "REDIS_TLS": "true",
          "REDIS_TLS_CACERT": "/ca.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"},
         "rediss://r:6380?ssl_ca_certs=%2Fca.pem&ssl_check_hostname=false"),
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "cluster", "REDIS_URL": "a:1,b:2"},
         "redis+cluster://a:1,b:2"),
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "SENTINEL", "REDIS_URL": "main,s1:26379,s2:1",
          "REDIS_AUTH": "pw", "REDIS_SENTINEL_AUTH": "spw"},
         "redis+sentinel://:pw@s1:26379,s2:1/main?sentinel_password=spw"),
    ],
)  # fmt: skip
def test_redis_variables_become_one_url_the_store_opens(env: dict[str, str], url: str) -> None:
    assert translate(env).variables["RLS_REDIS_URL"] == url
    assert open_redis(url).description  # the store accepts it (connects lazily)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"BACKEND_TYPE": "memcache"}, "BACKEND_TYPE"),
        ({"GRPC_UDS": "/tmp/rl.sock"}, "GRPC_UDS"),
        ({"CONFIG_TYPE": "GRPC_XDS_DELTA"}, "CONFIG_TYPE"),
        (
            {"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "a:b"},
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        ),
        (
            {"CONFIG_TYPE": "GRPC_XDS_SOTW", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "1m30s"},
            "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        ),
        ({"GRPC_SERVER_USE_TLS": "true"}, "GRPC_SERVER_TLS_CERT"),
        ({"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c"}, "GRPC_SERVER_TLS_KEY"),
        ({"MERGE_DOMAIN_CONFIG": "true"}, "MERGE_DOMAIN_CONFIG"),
        ({"SHADOW_MODE": "yes"}, "SHADOW_MODE"),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL"),
        ({"LOG_FORMAT": "xml"}, "LOG_FORMAT"),
        ({"GRPC_PORT": "grpc"}, "GRPC_PORT"),
        ({"REDIS_URL": "r:1", "REDIS_TYPE": "RING"}, "REDIS_TYPE"),
        ({"REDIS_URL": "r:1", "REDIS_SOCKET_TYPE": "udp"}, "REDIS_SOCKET_TYPE"),
        ({"REDIS_URL": "/s", "REDIS_TYPE": "CLUSTER"}, "REDIS_SOCKET_TYPE"),
        ({"REDIS_URL": "s1:1", "REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "SENTINEL"}, "SENTINEL"),
    ],
)
def test_a_variable_that_cannot_be_honoured_stops_the_start(
    env: dict[str, str], named: str
) -> None:
    with pytest.raises(ReferenceEnvError, match=named):
        translate(env)


def test_harmless_variables_are_noted_once_with_why() -> None:
    env = {"LOCAL_CACHE_SIZE_IN_BYTES": "1048576", "REDIS_PERSECOND": "true",
           "REDIS_PERSECOND_URL": "r2:6379", "MEMCACHE_HOST_PORT": "m:11211",
           "BACKEND_TYPE": "redis", "GRPC_SERVER_USE_TLS": "false"}  # fmt: skip
    notes = translate(env).ignored
    assert len(notes) == 4
    assert notes[0].startswith("LOCAL_CACHE_SIZE_IN_BYTES: every decision is made from local")
    assert any(n.startswith("REDIS_PERSECOND_URL: per-second limits share") for n in notes)
    assert "MEMCACHE_HOST_PORT: read only with BACKEND_TYPE=memcache" in notes


def test_xds_variables_as_envoy_gateway_sets_them() -> None:
    env = {
        "CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001",
        "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/certs/tls.crt",
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/certs/tls.key",
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/certs/ca.crt",
        "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL": "500ms",
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "2m", "XDS_CLIENT_BACKOFF_JITTER": "true",
    }  # fmt: skip
    translation = translate(env)
    assert {k: v for k, v in translation.variables.items() if "XDS" in k or "READY" in k} == {
        "RLS_CONFIG_XDS": "envoy-gateway:18001",
        "RLS_CONFIG_XDS_NODE_ID": "envoy-ratelimit",
        "RLS_CONFIG_XDS_CLIENT_TLS": "true",
        "RLS_CONFIG_XDS_CLIENT_TLS_CERT": "/certs/tls.crt",
        "RLS_CONFIG_XDS_CLIENT_TLS_KEY": "/certs/tls.key",
        "RLS_CONFIG_XDS_SERVER_TLS_CACERT": "/certs/ca.crt",
        "RLS_CONFIG_XDS_RETRY_S": "0.5",
        "RLS_CONFIG_XDS_RETRY_MAX_S": "120.0",
        "RLS_READY_WITHOUT_CONFIG": "true",
    }
    assert translation.ignored == (
        "XDS_CLIENT_BACKOFF_JITTER: reconnect delays are always jittered",
    )
    assert translate({"CONFIG_TYPE": "GRPC_XDS_SOTW"}).variables["RLS_CONFIG_XDS"] == (
        "localhost:18000"  # the reference's default
    )
    files = translate({"CONFIG_GRPC_XDS_NODE_ID": "n"})
    assert "RLS_CONFIG_XDS" not in files.variables
    assert files.ignored == ("CONFIG_GRPC_XDS_NODE_ID: read only with CONFIG_TYPE=GRPC_XDS_SOTW",)


# Every variable of envoyproxy/ratelimit's settings (src/settings/settings.go).
REFERENCE_VARIABLES = """
HOST PORT DEBUG_HOST DEBUG_PORT GRPC_UDS GRPC_HOST GRPC_PORT GRPC_MAX_CONNECTION_AGE
GRPC_MAX_CONNECTION_AGE_GRACE GRPC_SERVER_USE_TLS GRPC_SERVER_TLS_CERT GRPC_SERVER_TLS_KEY
GRPC_CLIENT_TLS_CACERT GRPC_CLIENT_TLS_SAN LOG_LEVEL LOG_FORMAT CONFIG_TYPE
FORCE_START_WITHOUT_INITIAL_CONFIG CONFIG_GRPC_XDS_NODE_ID CONFIG_GRPC_XDS_NODE_METADATA
CONFIG_GRPC_XDS_SERVER_URL CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL
CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS CONFIG_GRPC_XDS_SERVER_USE_TLS
CONFIG_GRPC_XDS_CLIENT_TLS_CERT CONFIG_GRPC_XDS_CLIENT_TLS_KEY CONFIG_GRPC_XDS_SERVER_TLS_CACERT
CONFIG_GRPC_XDS_SERVER_TLS_SAN XDS_CLIENT_BACKOFF_INITIAL_INTERVAL XDS_CLIENT_BACKOFF_MAX_INTERVAL
XDS_CLIENT_BACKOFF_RANDOM_FACTOR XDS_CLIENT_BACKOFF_JITTER XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES
USE_DOG_STATSD USE_DOG_STATSD_MOGRIFIERS USE_STATSD STATSD_HOST STATSD_PORT EXTRA_TAGS
STATS_FLUSH_INTERVAL DISABLE_STATS USE_PROMETHEUS PROMETHEUS_ADDR PROMETHEUS_PATH
PROMETHEUS_MAPPER_YAML PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS RUNTIME_ROOT RUNTIME_SUBDIRECTORY
RUNTIME_APPDIRECTORY RUNTIME_IGNOREDOTFILES RUNTIME_WATCH_ROOT EXPIRATION_JITTER_MAX_SECONDS
LOCAL_CACHE_SIZE_IN_BYTES NEAR_LIMIT_RATIO CACHE_KEY_PREFIX BACKEND_TYPE
STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT LIMIT_RESPONSE_HEADERS_ENABLED LIMIT_LIMIT_HEADER
LIMIT_REMAINING_HEADER LIMIT_RESET_HEADER HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
REDIS_SOCKET_TYPE REDIS_TYPE REDIS_URL REDIS_POOL_SIZE REDIS_AUTH REDIS_TLS REDIS_TLS_CLIENT_CERT
REDIS_TLS_CLIENT_KEY REDIS_TLS_CACERT REDIS_TLS_SKIP_HOSTNAME_VERIFICATION REDIS_PIPELINE_WINDOW
REDIS_PIPELINE_LIMIT REDIS_CLUSTER_PIPELINE_PARALLELISM REDIS_PERSECOND REDIS_PERSECOND_SOCKET_TYPE
REDIS_PERSECOND_TYPE REDIS_PERSECOND_URL REDIS_PERSECOND_POOL_SIZE REDIS_PERSECOND_AUTH
REDIS_PERSECOND_TLS REDIS_SENTINEL_AUTH REDIS_PERSECOND_SENTINEL_AUTH
REDIS_PERSECOND_PIPELINE_WINDOW REDIS_PERSECOND_PIPELINE_LIMIT
REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM REDIS_HEALTH_CHECK_ACTIVE_CONNECTION REDIS_TIMEOUT
REDIS_PERSECOND_TIMEOUT REDIS_POOL_ON_EMPTY_BEHAVIOR REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR
REDIS_STARTUP_INITIAL_INTERVAL REDIS_STARTUP_MAX_INTERVAL REDIS_STARTUP_MAX_ELAPSED_TIME
MEMCACHE_HOST_PORT MEMCACHE_MAX_IDLE_CONNS MEMCACHE_SRV MEMCACHE_SRV_REFRESH MEMCACHE_TLS
MEMCACHE_TLS_CLIENT_CERT MEMCACHE_TLS_CLIENT_KEY MEMCACHE_TLS_CACERT
MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION SHADOW_MODE QUOTA_MODE RESPONSE_DYNAMIC_METADATA
MERGE_DOMAIN_CONFIG TRACING_ENABLED TRACING_SERVICE_NAME TRACING_SERVICE_NAMESPACE
TRACING_SERVICE_INSTANCE_ID TRACING_EXPORTER_PROTOCOL TRACING_SAMPLING_RATE
""".split()  # noqa: SIM905 - a table of names, one word each


def test_every_reference_variable_is_read_ignored_or_refused() -> None:
    assert [name for name in REFERENCE_VARIABLES if not known(name)] == []
    assert not known("REDIS_URLS")


def test_grpc_server_tls_variables_become_the_tls_settings() -> None:
    env = {"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/certs/tls.crt",
           "GRPC_SERVER_TLS_KEY": "/certs/tls.key", "GRPC_CLIENT_TLS_CACERT": "/certs/ca.crt",
           "GRPC_CLIENT_TLS_SAN": "envoy-gateway"}  # fmt: skip
    variables = translate(env).variables
    assert variables["RLS_GRPC_TLS_CERT"] == "/certs/tls.crt"
    assert variables["RLS_GRPC_TLS_KEY"] == "/certs/tls.key"
    assert variables["RLS_GRPC_TLS_CLIENT_CA"] == "/certs/ca.crt"
    assert variables["RLS_GRPC_TLS_CLIENT_SAN"] == "envoy-gateway"
    off = translate({**env, "GRPC_SERVER_USE_TLS": "false"})
    assert "RLS_GRPC_TLS_CERT" not in off.variables


def test_tracing_variables_become_the_tracing_settings() -> None:
    env = {"TRACING_ENABLED": "true", "TRACING_SERVICE_NAME": "RateLimit",
           "TRACING_SAMPLING_RATE": "0.01", "TRACING_SERVICE_NAMESPACE": "edge"}  # fmt: skip
    variables = translate(env).variables
    assert variables["RLS_TRACING"] == "true"
    assert variables["RLS_TRACING_PROTOCOL"] == "http"  # the reference's default
    assert variables["RLS_TRACING_SAMPLING_RATIO"] == "0.01"
    assert variables["RLS_TRACING_SERVICE_NAME"] == "RateLimit"
    assert variables["RLS_TRACING_SERVICE_NAMESPACE"] == "edge"
    assert "RLS_TRACING" not in translate({"TRACING_SAMPLING_RATE": "1"}).variables


def test_connection_age_variables_are_go_durations() -> None:
    env = {"GRPC_MAX_CONNECTION_AGE": "5m", "GRPC_MAX_CONNECTION_AGE_GRACE": "30s"}
    variables = translate(env).variables
    assert variables["RLS_GRPC_MAX_CONNECTION_AGE_S"] == "300.0"
    assert variables["RLS_GRPC_MAX_CONNECTION_AGE_GRACE_S"] == "30.0"
    with pytest.raises(ReferenceEnvError, match="GRPC_MAX_CONNECTION_AGE='forever'"):
        translate({"GRPC_MAX_CONNECTION_AGE": "forever"})


def test_near_limit_ratio_is_the_setting() -> None:
    assert translate({"NEAR_LIMIT_RATIO": "0.9"}).variables["RLS_NEAR_LIMIT_RATIO"] == "0.9"


def test_response_header_variables_become_the_header_settings() -> None:
    env = {"LIMIT_RESPONSE_HEADERS_ENABLED": "TRUE", "LIMIT_RESET_HEADER": "X-Reset"}
    variables = translate(env).variables
    assert variables["RLS_LIMIT_RESPONSE_HEADERS"] == "true"
    names = "RateLimit-Limit,RateLimit-Remaining,X-Reset"
    assert variables["RLS_LIMIT_RESPONSE_HEADER_NAMES"] == names
    assert "RLS_LIMIT_RESPONSE_HEADERS" not in translate({"LIMIT_RESET_HEADER": "x"}).variables

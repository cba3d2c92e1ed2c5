"""The reference's variables that are harmless here, each with why: the `ratelimit` command logs
each one that is set once at start, and docs/REFERENCE.md lists them."""

from __future__ import annotations

# Harmless here: set, they are logged once with the reason.
IGNORED = {
    "USE_STATSD": "metrics are Prometheus text at /metrics; statsd is not spoken",
    "STATSD_HOST": "statsd is not spoken",
    "STATSD_PORT": "statsd is not spoken",
    "USE_DOG_STATSD": "statsd is not spoken",
    "USE_DOG_STATSD_MOGRIFIERS": "statsd is not spoken",
    "EXTRA_TAGS": "metrics carry this sidecar's own labels",
    "STATS_FLUSH_INTERVAL": "Prometheus metrics are read when scraped",
    "DISABLE_STATS": "Prometheus metrics cost nothing until scraped",
    "PROMETHEUS_PATH": "metrics are always at /metrics",
    "PROMETHEUS_MAPPER_YAML": "metric names are this sidecar's own (README, Metrics)",
    "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "decision times are histograms in seconds",
    "LOCAL_CACHE_SIZE_IN_BYTES": "every decision is made from local memory already",
    "EXPIRATION_JITTER_MAX_SECONDS": "keys expire with their windows",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "refused requests never count here",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "health waits for the first rules already",
    "RUNTIME_WATCH_ROOT": "the rule directory is watched whatever its layout",
    "RUNTIME_IGNOREDOTFILES": "files whose names start with a dot are never read as rules",
    "REDIS_POOL_SIZE": "the sync loop keeps one connection per Redis node",
    "REDIS_PIPELINE_WINDOW": "each sync is one pipelined round trip per Redis node",
    "REDIS_PIPELINE_LIMIT": "each sync is one pipelined round trip per Redis node",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM": "each sync is one pipelined round trip per node",
    "REDIS_TIMEOUT": "the request path never waits for Redis (sync timeout: RLS_SYNC_TIMEOUT_MS)",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "health never depends on Redis",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR": "the request path never waits for a Redis connection",
    "REDIS_STARTUP_INITIAL_INTERVAL": "the sidecar starts without Redis and syncs once it answers",
    "REDIS_STARTUP_MAX_INTERVAL": "the sidecar starts without Redis and syncs once it answers",
    "REDIS_STARTUP_MAX_ELAPSED_TIME": "the sidecar starts without Redis and syncs once it answers",
    "GRPC_SERVER_TLS_CA_CERT": "the reference does not read it either (GRPC_CLIENT_TLS_CACERT)",
    "TRACING_SERVICE_INSTANCE_ID": "spans carry service.name and service.namespace only",
}

"""Settings as the CLI and the --workers supervisor see them: flags, variables, defaults."""

from __future__ import annotations

import os
from dataclasses import fields

import pytest

from ratelimit_sidecar.app.flags import OPTIONS, settings_from
from ratelimit_sidecar.app.settings import REUSE_PORT_ENV, Settings
from ratelimit_sidecar.app.workers import WORKER_COMMAND, worker_env, worker_settings
from ratelimit_sidecar.cli import build_parser

# The names operators already use; each must keep working.
EXISTING_FLAGS = {
    "--config": "RLS_CONFIG",
    "--redis-url": "RLS_REDIS_URL",
    "--grpc-address": "RLS_GRPC_ADDRESS",
    "--metrics-address": "RLS_METRICS_ADDRESS",
    "--node-id": "RLS_NODE_ID",
    "--workers": "RLS_WORKERS",
    "--log-format": "RLS_LOG_FORMAT",
    "--log-level": "RLS_LOG_LEVEL",
    "--max-keys": "RLS_MAX_KEYS",
    "--redis-prefix": "RLS_REDIS_PREFIX",
    "--sync-timeout-ms": "RLS_SYNC_TIMEOUT_MS",
    "--shadow-mode": "RLS_SHADOW_MODE",
    "--ietf-headers": "RLS_IETF_HEADERS",
}


def parse(*argv: str) -> Settings:
    values = vars(build_parser().parse_args(["serve", *argv]))
    del values["command"]
    return settings_from(values)


@pytest.fixture(autouse=True)
def _no_inherited_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for option in OPTIONS:
        monkeypatch.delenv(option.env, raising=False)


def test_every_field_is_an_option_and_every_existing_name_is_kept() -> None:
    assert [option.name for option in OPTIONS] == [spec.name for spec in fields(Settings)]
    assert {option.flag: option.env for option in OPTIONS}.items() >= EXISTING_FLAGS.items()
    assert all(option.help for option in OPTIONS)


def test_unset_options_take_the_dataclass_defaults() -> None:
    settings = parse("--config", "rules")
    expected = Settings(config_path="rules", node_id=settings.node_id)
    assert settings == expected
    assert settings.node_id.endswith(f"-{os.getpid()}")  # hostname-pid


def test_flags_convert_to_the_field_types() -> None:
    settings = parse(
        "--config", "r", "--max-keys", "7", "--shutdown-grace-s", "1.5", "--ietf-headers",
        "--max-descriptors", "3",
    )  # fmt: skip
    assert (settings.max_keys, settings.shutdown_grace_s) == (7, 1.5)
    assert (settings.ietf_headers, settings.shadow_mode, settings.max_descriptors) == (
        True,
        False,
        3,
    )


def test_environment_sets_defaults_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLS_CONFIG", "from-env")
    monkeypatch.setenv("RLS_MAX_KEYS", "11")
    monkeypatch.setenv("RLS_SHADOW_MODE", "yes")
    monkeypatch.setenv("RLS_RELOAD_POLL_S", "2")
    settings = parse("--max-keys", "12")
    assert settings.config_path == "from-env"
    assert (settings.max_keys, settings.shadow_mode, settings.reload_poll_s) == (12, True, 2.0)


def test_empty_variables_mean_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLS_REDIS_URL", "")
    monkeypatch.setenv("RLS_NODE_ID", "")
    monkeypatch.setenv("RLS_IETF_HEADERS", "off")
    settings = parse("--config", "r")
    assert settings.redis_url is None and settings.local_only
    assert settings.node_id  # hostname-pid, not ""
    assert settings.ietf_headers is False


def test_a_bad_variable_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLS_MAX_KEYS", "many")
    with pytest.raises(SystemExit) as exited:
        parse("--config", "r")
    assert exited.value.code == 2


def test_a_worker_reads_back_its_settings_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parent = Settings(
        config_path="rules",
        redis_url="redis://app:s3cret@127.0.0.1:6390/0",
        metrics_address="127.0.0.1:9100",
        node_id="n",
        workers=3,
        shadow_mode=True,
        max_value_bytes=99,
        shutdown_grace_s=0.25,
    )
    child = worker_settings(parent, 2)
    env = worker_env(child)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert parse() == child
    assert (child.node_id, child.metrics_address, child.workers) == ("n-w2", "127.0.0.1:9102", 1)
    assert env[REUSE_PORT_ENV] == "1"
    assert not any("s3cret" in arg for arg in WORKER_COMMAND)  # argv shows in `ps`


def test_a_worker_without_redis_stays_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLS_REDIS_URL", "redis://127.0.0.1:1/0")  # the parent's, overridden
    child = worker_settings(Settings(config_path="rules", node_id="n"), 0)
    for name, value in worker_env(child).items():
        monkeypatch.setenv(name, value)
    assert parse().local_only


def test_xds_settings_are_flags() -> None:
    settings = parse(
        "--config-xds", "eg:18001", "--config-xds-node-id", "envoy-ratelimit",
        "--config-xds-client-tls", "--config-xds-retry-s", "0.5", "--ready-without-config",
    )  # fmt: skip
    assert (settings.xds_url, settings.config_xds_node_id) == ("eg:18001", "envoy-ratelimit")
    assert settings.config_xds_client_tls and settings.ready_without_config
    assert (settings.config_xds_retry_s, settings.config_xds_retry_max_s) == (0.5, 60.0)
    assert settings.config_path == ""  # no --config needed


def test_config_is_required_unless_rules_come_from_xds() -> None:
    with pytest.raises(ValueError, match="--config"):
        parse()
    assert parse("--config-xds", "127.0.0.1:18000").xds_url == "127.0.0.1:18000"
    assert parse("--config", "r").xds_url is None
    with pytest.raises(ValueError, match="go together"):
        parse("--config-xds", "h:1", "--config-xds-client-tls-cert", "c.pem")

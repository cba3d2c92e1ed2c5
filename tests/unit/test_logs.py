"""Log output: JSON lines, and no Redis password in any line."""

from __future__ import annotations

import json
import logging

import pytest

from ratelimit_sidecar.logs import JsonFormatter, redact, setup_logging


def test_redact_hides_url_passwords_only() -> None:
    text = "connect redis://app:s3cret@10.0.0.5:6379/0 and rediss://:pw@h:1 and redis://h:2"
    assert (
        redact(text)
        == "connect redis://app:***@10.0.0.5:6379/0 and rediss://:***@h:1 and redis://h:2"
    )


def test_json_format_is_one_object_per_line_without_secrets() -> None:
    record = logging.LogRecord(
        "ratelimit_sidecar.x", logging.INFO, "f", 1, "to %s", ("redis://u:p@h:1",), None
    )
    entry = json.loads(JsonFormatter().format(record))
    assert entry["level"] == "info" and entry["logger"] == "ratelimit_sidecar.x"
    assert entry["msg"] == "to redis://u:***@h:1"


def test_setup_logging_uses_named_loggers(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("json", "debug")
    logging.getLogger("ratelimit_sidecar.test").debug("hello redis://a:b@c:1")
    line = capsys.readouterr().err.strip()
    assert json.loads(line)["msg"] == "hello redis://a:***@c:1"

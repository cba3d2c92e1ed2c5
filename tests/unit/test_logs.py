"""Log output: JSON lines, and no Redis password in any line."""

from __future__ import annotations

import json
import logging

import pytest

from ratelimit_sidecar.logs import JsonFormatter, TextFormatter, redact, setup_logging


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        ("redis://app:s3cret@10.0.0.5:6379/0", "redis://app:***@10.0.0.5:6379/0"),
        ("rediss://:pw@h:1 and redis://h:2", "rediss://:***@h:1 and redis://h:2"),
        ("redis://u:p@ss@h:1/0", "redis://u:***@h:1/0"),  # an unquoted @ in the password
        ("redis://h:1/0?password=pw&db=2", "redis://h:1/0?password=***&db=2"),
        (
            "redis+sentinel://h:1/m?socket_timeout=1&Sentinel_Password=pw",
            "redis+sentinel://h:1/m?socket_timeout=1&Sentinel_Password=***",
        ),
        (
            "unix://u:pw@/run/r.sock?password=pw refused",
            "unix://u:***@/run/r.sock?password=*** refused",
        ),
        # A value runs to the next `&`, `#` or space: a quote may be part of a password.
        ("'redis://h:1?password=a'b' x", "'redis://h:1?password=*** x"),
        ("no url here: user:pw@host, passwords=3", "no url here: user:pw@host, passwords=3"),
        ("redis://h:1/0?password_file=/etc/x", "redis://h:1/0?password_file=/etc/x"),
    ],
)
def test_redact_hides_url_passwords_only(text: str, redacted: str) -> None:
    assert redact(text) == redacted


def test_json_format_is_one_object_per_line_without_secrets() -> None:
    record = logging.LogRecord(
        "ratelimit_sidecar.x", logging.INFO, "f", 1, "to %s", ("redis://u:p@h:1",), None
    )
    entry = json.loads(JsonFormatter().format(record))
    assert entry["level"] == "info" and entry["logger"] == "ratelimit_sidecar.x"
    assert entry["msg"] == "to redis://u:***@h:1"


def test_text_format_hides_query_passwords_too() -> None:
    record = logging.LogRecord(
        "ratelimit_sidecar.x", logging.INFO, "f", 1, "%s", ("redis://h:1?password=pw",), None
    )
    assert TextFormatter("%(message)s").format(record) == "redis://h:1?password=***"


def test_setup_logging_uses_named_loggers(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("json", "debug")
    logging.getLogger("ratelimit_sidecar.test").debug("hello redis://a:b@c:1")
    line = capsys.readouterr().err.strip()
    assert json.loads(line)["msg"] == "hello redis://a:***@c:1"

"""Logging set-up: named loggers under `ratelimit_sidecar`, text or one JSON object per line."""

from __future__ import annotations

import json
import logging
import re
import sys

# A URL's user-info password: everything between `user:` and the authority's last `@`.
_USERINFO_PASSWORD = re.compile(r"(?<=://)([^:@/\s]*):[^/\s]*@")
# A query option named `password` or `*_password` (sentinel_password=, ssl_password=...).
_QUERY_PASSWORD = re.compile(r"([?&][^=&\s]*password=)[^&#\s]*", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with the passwords of the URLs in it hidden: `redis://user:***@host/0?password=***`.

    Used on every log line and on the URL quoted by errors; the user name stays readable.
    """
    text = _USERINFO_PASSWORD.sub(r"\1:***@", text)
    return _QUERY_PASSWORD.sub(r"\1***", text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        if record.exc_info:
            entry["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def setup_logging(fmt: str = "text", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("ratelimit_sidecar")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False

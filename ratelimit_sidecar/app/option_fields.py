"""How a setting is declared, and the one place its field metadata is written and read.

`Settings` (app/settings.py) declares each option as a dataclass field with this metadata;
app/flags.py reads it back to derive the flag, the environment variable and the help text.
"""

from __future__ import annotations

from dataclasses import Field, field
from typing import Any


def described(text: str, **more: str) -> dict[str, str]:
    """Field metadata: `help`, and optionally `flag` (a name other than the field's) and
    `default_text` (how to show a default computed at start-up)."""
    return {"help": text, **more}


def option(default: Any, text: str) -> Any:
    """A field with a default and its help: one line per setting."""
    return field(default=default, metadata=described(text))


def flag_name(spec: Field[Any]) -> str:
    return str(spec.metadata.get("flag", spec.name))


def help_text(spec: Field[Any]) -> str:
    return str(spec.metadata["help"])


def default_text(spec: Field[Any], shown: str) -> str:
    """What --help shows as the default: `shown`, unless the field says otherwise."""
    return str(spec.metadata.get("default_text", shown))

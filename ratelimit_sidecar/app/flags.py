"""The settings as the command line and the environment see them: a flag and an `RLS_`
variable per field. The CLI builds its parser from `OPTIONS`, and the `--workers` supervisor
hands its children their settings through `environment`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any, NamedTuple, get_args, get_type_hints

from ratelimit_sidecar.app.option_fields import default_text, flag_name, help_text
from ratelimit_sidecar.app.settings import ENV_PREFIX, Settings

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


class Option(NamedTuple):
    """One settings field as the command line and the environment see it."""

    name: str  # the Settings field
    flag: str  # --max-keys
    env: str  # RLS_MAX_KEYS
    kind: type  # bool, int, float or str
    help: str
    default_text: str  # "" when the field has no default (required)

    def parse(self, text: str) -> Any:
        """The value an environment variable's text stands for."""
        return text.lower() in TRUE_WORDS if self.kind is bool else self.kind(text)

    def text(self, value: object) -> str:
        """The environment text that `parse` reads back as `value`."""
        if value is None:
            return ""
        return ("true" if value else "false") if self.kind is bool else str(value)


def _options() -> tuple[Option, ...]:
    hints = get_type_hints(Settings)
    found = []
    for spec in fields(Settings):
        name = flag_name(spec)
        kinds = [kind for kind in get_args(hints[spec.name]) if kind is not type(None)]
        # Shown in --help; nothing for a switch (off) or an optional value (unset).
        default = "" if spec.default in (MISSING, None, False) else str(spec.default)
        found.append(
            Option(
                name=spec.name,
                flag="--" + name.replace("_", "-"),
                env=ENV_PREFIX + name.upper(),
                kind=kinds[0] if kinds else hints[spec.name],
                help=help_text(spec),
                default_text=default_text(spec, default),
            )
        )
    return tuple(found)


OPTIONS = _options()


def settings_from(values: Mapping[str, Any]) -> Settings:
    """Settings from option values by field name; None or "" leaves the field's default."""
    return Settings(**{name: value for name, value in values.items() if value not in (None, "")})


def environment(settings: Settings) -> dict[str, str]:
    """Every setting as its environment variable, for a child process to read back.

    By environment rather than argv, so the Redis URL's password never shows in `ps`.
    """
    return {option.env: option.text(getattr(settings, option.name)) for option in OPTIONS}

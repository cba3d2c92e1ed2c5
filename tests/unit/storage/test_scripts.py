"""The Lua scripts' loader (storage/scripts.py): what each script includes, the constants the
Python side owns, and NOSCRIPT handled once."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import pytest
from redis import exceptions as rex

from ratelimit_sidecar.core.penalty import MAX_GRACE_MS, MAX_LEVELS
from ratelimit_sidecar.storage import scripts

PACKAGED = sorted(
    p.name
    for p in resources.files("ratelimit_sidecar.storage").iterdir()
    if p.name.endswith(".lua")
)
CALLED = (
    "sync.lua",
    "sync_sliding.lua",
    "sync_bucket.lua",
    "strict.lua",
    "overrides.lua",
    "heartbeat.lua",
)


def test_every_called_script_names_what_it_includes_and_each_include_is_packaged() -> None:
    for name in CALLED:
        own = resources.files("ratelimit_sidecar.storage").joinpath(name).read_text()
        for line in re.findall(r"^-- include:(.*)$", own, re.MULTILINE):
            assert set(line.split()) <= set(PACKAGED), name
    assert set(PACKAGED) - set(CALLED) == {"block_flag.lua", "penalty.lua", "sync_common.lua"}


def test_includes_come_first_and_every_function_a_script_calls_is_defined() -> None:
    script = scripts.load("sync.lua")
    order = [script.source.index(f"local function {f}(") for f in ("held_left", "penalty_of")]
    assert order == sorted(order) and max(order) < script.source.index("local function push(")
    assert "local function cooled(" in script.source


@pytest.mark.parametrize("name", CALLED)
def test_the_constants_come_from_python(name: str) -> None:
    source = scripts.load(name).source
    assert re.search(r"\{\{\w+\}\}", source) is None
    if name not in {"overrides.lua", "heartbeat.lua"}:  # the ones without penalties
        assert f"level < {MAX_LEVELS} and" in source
        assert f"math.min({MAX_GRACE_MS}, " in source
    if name.startswith("sync"):
        assert f"'{scripts.KEY_ERROR}' .. " in source and f", 1, {scripts.MAX_REASON})" in source


async def test_a_script_the_server_does_not_know_is_sent_again_with_its_text() -> None:
    sent: list[tuple[Any, ...]] = []

    async def execute(*command: Any) -> Any:
        sent.append(command)
        if command[0] == "EVALSHA":
            raise rex.NoScriptError("NOSCRIPT No matching script.")
        return "ran"

    script = scripts.load("overrides.lua")
    assert await scripts.call(execute, script, 1, "k") == "ran"
    assert sent == [("EVALSHA", script.sha, 1, "k"), ("EVAL", script.source, 1, "k")]


async def test_any_other_failure_is_not_sent_again() -> None:
    calls = 0

    async def execute(*command: Any) -> Any:
        nonlocal calls
        calls += 1
        raise rex.ResponseError("WRONGTYPE")

    with pytest.raises(rex.ResponseError):
        await scripts.call(execute, scripts.load("overrides.lua"), 1, "k")
    assert calls == 1

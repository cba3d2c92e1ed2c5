"""Loading within bounds: each limit refuses with one problem naming file, line and the limit."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from harness.hostile_rules import (
    GOOD_RULES,
    alias_bomb,
    alias_cycle,
    deep_nesting,
    many_descriptors,
    sparse_file,
)
from ratelimit_sidecar.app.flags import OPTIONS
from ratelimit_sidecar.app.settings import Settings
from ratelimit_sidecar.config import ConfigError, Problem, load_rules
from ratelimit_sidecar.config.limits import (
    DEFAULT_LIMITS,
    LIMIT_NAMES,
    MAX_YAML_DEPTH,
    ConfigLimits,
    LoadStopped,
)

MIB = 1024 * 1024


def problems_of(path: Path, limits: ConfigLimits = DEFAULT_LIMITS) -> list[Problem]:
    with pytest.raises(ConfigError) as caught:
        load_rules(path, limits)
    return caught.value.problems


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    # 50 MB of zeros: reading it would report "invalid YAML", not its size.
    path = sparse_file(tmp_path / "huge.yaml", 50 * MIB)

    assert problems_of(path) == [
        Problem(
            str(path),
            0,
            "file",
            f"{50 * MIB} bytes is more than the limit of {4 * MIB} bytes per rule file"
            " (raise it with --max-rule-file-bytes / RLS_MAX_RULE_FILE_BYTES)",
        )
    ]


def test_a_file_at_the_size_limit_loads(tmp_path: Path) -> None:
    path = write(tmp_path / "r.yaml", GOOD_RULES)
    size = path.stat().st_size

    assert load_rules(path, ConfigLimits(max_rule_file_bytes=size)).domain("d") is not None
    [problem] = problems_of(path, ConfigLimits(max_rule_file_bytes=size - 1))
    assert (problem.file, problem.line, problem.key) == (str(path), 0, "file")


def test_a_directory_over_the_total_limit_is_refused(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write(tmp_path / f"{name}.yaml", GOOD_RULES.replace("domain: d", f"domain: {name}"))
    total = 2 * len(GOOD_RULES)

    assert problems_of(tmp_path, ConfigLimits(max_rule_dir_bytes=total - 1)) == [
        Problem(
            str(tmp_path),
            0,
            "file",
            f"the rule files total {total} bytes, more than the limit of {total - 1} bytes"
            " (raise it with --max-rule-dir-bytes / RLS_MAX_RULE_DIR_BYTES)",
        )
    ]
    assert len(load_rules(tmp_path, ConfigLimits(max_rule_dir_bytes=total)).domains) == 2


def test_an_alias_bomb_is_refused_at_the_alias_that_passes_the_node_limit(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "bomb.yaml", alias_bomb(levels=10, fan_out=10))
    assert path.stat().st_size < 1000

    # Level i stands for 5 + 10 x level(i - 1) nodes (level 0: 9); the count passes 10^6 at the
    # tenth alias of level 5, on line 8.
    assert problems_of(path) == [
        Problem(
            str(path),
            8,
            "yaml",
            "with aliases expanded, the file has more than 1000000 YAML nodes"
            " (raise the limit with --max-yaml-nodes / RLS_MAX_YAML_NODES)",
        )
    ]


def test_the_node_limit_counts_plain_nodes_too(tmp_path: Path) -> None:
    items = ", ".join(f"{{key: k{i}}}" for i in range(10))  # 1 + 10 x 3 nodes
    path = write(tmp_path / "r.yaml", f"domain: d\ndescriptors: [{items}]\n")

    load_rules(path, ConfigLimits(max_yaml_nodes=35))  # 4 above the list, 31 in it
    [problem] = problems_of(path, ConfigLimits(max_yaml_nodes=34))
    assert (problem.line, problem.key) == (2, "yaml")
    assert problem.message == (
        "the file has more than 34 YAML nodes"
        " (raise the limit with --max-yaml-nodes / RLS_MAX_YAML_NODES)"
    )


def test_an_alias_inside_the_node_it_refers_to_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "cycle.yaml", alias_cycle())

    assert problems_of(path) == [
        Problem(str(path), 4, "yaml", "alias *all is inside the node it refers to")
    ]


def test_nesting_deeper_than_the_limit_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "deep.yaml", deep_nesting(10 * MAX_YAML_DEPTH))

    assert problems_of(path) == [
        Problem(str(path), 2, "yaml", f"nested more than {MAX_YAML_DEPTH} levels deep")
    ]


def test_descriptors_are_counted_across_the_files_of_a_directory(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", many_descriptors(3).replace("domain: many", "domain: a"))
    second = write(tmp_path / "b.yaml", many_descriptors(3).replace("domain: many", "domain: b"))

    load_rules(tmp_path, ConfigLimits(max_rule_descriptors=6))
    assert problems_of(tmp_path, ConfigLimits(max_rule_descriptors=5)) == [
        Problem(
            str(second),
            9,  # the third descriptor of the second file: lines 3, 6, 9
            "descriptors[2]",
            "more than 5 descriptors in the rule set"
            " (raise the limit with --max-rule-descriptors / RLS_MAX_RULE_DESCRIPTORS)",
        )
    ]


def test_descriptors_repeated_by_aliases_count_each_time(tmp_path: Path) -> None:
    # 4 levels of 10 aliases: small enough for the node limit, 1111 descriptors to build.
    path = write(tmp_path / "bomb.yaml", alias_bomb(levels=4, fan_out=10))

    [problem] = problems_of(path, ConfigLimits(max_rule_descriptors=1000))
    # Depth first, levels 0-2 count 123 and each level 2 copy 111, each level 1 copy 11: the
    # 1001st is a copy of level 0, written on line 3, reached by this path.
    key = "descriptors[3].descriptors[7].descriptors[8].descriptors[9]"
    assert (problem.line, problem.key) == (3, key)
    assert problem.message.startswith("more than 1000 descriptors in the rule set")


def test_problems_before_a_passed_limit_are_kept(tmp_path: Path) -> None:
    bad = write(tmp_path / "a.yaml", "domain: a\ndescriptors:\n  - {key: k, shadow_mode: 3}\n")
    bomb = write(tmp_path / "b.yaml", alias_bomb())

    assert [(p.file, p.line) for p in problems_of(tmp_path)] == [(str(bad), 3), (str(bomb), 8)]


def test_a_stopped_load_ends_at_its_next_pause(tmp_path: Path) -> None:
    path = write(tmp_path / "r.yaml", many_descriptors(2000))  # loads in well over a millisecond
    asked: list[bool] = []

    def stopped() -> bool:
        asked.append(True)
        return True

    with pytest.raises(LoadStopped):
        load_rules(path, stopped=stopped)
    assert asked == [True]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_left_as_it_was(tmp_path: Path, enabled: bool) -> None:
    good = write(tmp_path / "good.yaml", GOOD_RULES)
    bomb = write(tmp_path / "bomb.yaml", alias_bomb())
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        load_rules(good)
        with pytest.raises(ConfigError):
            load_rules(bomb)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_limits_are_settings_with_the_same_defaults() -> None:
    flags = {option.name: option for option in OPTIONS}
    settings = Settings(config_path="r.yaml")

    assert ConfigLimits.of(settings) == DEFAULT_LIMITS
    assert ConfigLimits(4 * MIB, 16 * MIB, 100_000, 1_000_000) == DEFAULT_LIMITS
    for name in LIMIT_NAMES:
        assert flags[name].flag == "--" + name.replace("_", "-")
        assert flags[name].env == "RLS_" + name.upper()

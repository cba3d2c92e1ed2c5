"""Rule files that try to make loading stall: alias bombs, cycles, deep nesting, huge files."""

from __future__ import annotations

import os
from pathlib import Path

GOOD_RULES = (
    "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n"
)


def alias_bomb(levels: int = 10, fan_out: int = 10) -> str:
    """A "billion laughs": level i lists `fan_out` aliases of level i - 1, so walking the last
    level visits about fan_out ** levels descriptors; under a kilobyte for 10 x 10. Level i is
    on line i + 3."""
    lines = ["domain: bomb", "descriptors:"]
    lines.append("  - &a0 {key: k0, rate_limit: {unit: hour, requests_per_unit: 1}}")
    for level in range(1, levels):
        aliases = ", ".join([f"*a{level - 1}"] * fan_out)
        lines.append(f"  - &a{level} {{key: k{level}, descriptors: [{aliases}]}}")
    return "\n".join(lines) + "\n"


def alias_cycle() -> str:
    """A descriptor list that contains itself: its walk never ends. The alias is on line 4."""
    return "domain: d\ndescriptors: &all\n  - key: k\n    descriptors: *all\n"


def deep_nesting(levels: int) -> str:
    """`levels` nested flow lists under `descriptors`, all on line 2."""
    return "domain: d\ndescriptors: " + "[" * levels + "]" * levels + "\n"


def many_descriptors(count: int, bad_unit_at_end: bool = False) -> str:
    """`count` valid descriptors (about 97 bytes each), then optionally one with a bad unit."""
    lines = ["domain: many", "descriptors:"]
    for index in range(count):
        lines.append(f"  - key: client\n    value: client-{index:07d}")
        lines.append(f"    rate_limit: {{unit: minute, requests_per_unit: {100 + index % 50}}}")
    if bad_unit_at_end:
        lines.append("  - key: last\n    rate_limit: {unit: fortnight, requests_per_unit: 1}")
    return "\n".join(lines) + "\n"


def sparse_file(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk space and no time to write (all zeros)."""
    with path.open("wb") as stream:
        os.truncate(stream.fileno(), size)
    return path

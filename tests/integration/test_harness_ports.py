"""The harness's free loopback ports: one call gives one process distinct ports, none avoided
(a sidecar restarted beside its admin port once bound its metrics port twice)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from harness import net


def test_free_ports_are_distinct_and_skip_the_avoided(monkeypatch: pytest.MonkeyPatch) -> None:
    first, avoided, second = net.free_ports(3)
    tried: Iterator[int] = iter([first, first, avoided, second])
    monkeypatch.setattr(random, "randrange", lambda *_: next(tried))
    assert net.free_ports(2, avoid=(avoided,)) == [first, second]

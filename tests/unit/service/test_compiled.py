"""Requests are parsed and matched once per distinct bytes; the cache is bounded and never stale."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.answer import answer_now
from harness.grpc_client import request
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.core import FleetLimiter
from ratelimit_sidecar.service.compiled import MAX_REQUEST_BYTES, CompiledRequest, RequestCache
from ratelimit_sidecar.service.fast_path import OneCounted
from ratelimit_sidecar.service.ratelimit import RateLimitHandler
from ratelimit_sidecar.service.validation import InvalidRequest

T0 = 1_700_000_040_000
OK, OVER = wire.Code.OK, wire.Code.OVER_LIMIT


def rules_file(tmp_path: Path, rpu: int) -> Path:
    path = tmp_path / "d.yaml"
    limit = f"{{unit: minute, requests_per_unit: {rpu}}}"
    path.write_text(f"domain: d\ndescriptors:\n  - key: user\n    rate_limit: {limit}\n")
    return path


def handler(tmp_path: Path, rpu: int = 2, entries: int = 100) -> RateLimitHandler:
    rules = load_rules(rules_file(tmp_path, rpu))
    return RateLimitHandler(rules, FleetLimiter(), lambda: T0, cache_entries=entries)


def raw(value: str, domain: str = "d") -> bytes:
    return request(domain, [("user", value)]).SerializeToString()


def code(h: RateLimitHandler, body: bytes) -> int:
    return wire.RateLimitResponse.FromString(answer_now(h, body)).overall_code


def test_repeated_bytes_reuse_the_compiled_request_but_counters_still_move(
    tmp_path: Path,
) -> None:
    h = handler(tmp_path)
    body = raw("a")
    assert code(h, body) == OK
    compiled = h._compiled.get(body)
    assert compiled is not None
    assert [code(h, body), code(h, body)] == [OK, OVER]
    assert h._compiled.get(body) is compiled


def test_counters_of_one_rule_share_their_domain_and_key_strings(tmp_path: Path) -> None:
    """100,000 clients of one rule hold one domain and one key string, not 100,000 of each."""
    path = tmp_path / "shop.yaml"  # names of one character are shared by Python anyway
    limit = "rate_limit: {unit: minute, requests_per_unit: 2}"
    path.write_text(f"domain: shop\ndescriptors:\n  - key: user\n    {limit}\n")
    h = RateLimitHandler(load_rules(path), FleetLimiter(), lambda: T0)
    bodies = [raw("a", domain="shop"), raw("b", domain="shop")]
    for body in bodies:
        code(h, body)
    states = list(h.limiter.keys)
    keys = [state.key for state in states]
    assert [key[2] for key in keys] == ["a", "b"]
    assert keys[0][0] is keys[1][0] and keys[0][1] is keys[1][1]
    first, second = (h._compiled.get(body) for body in bodies)
    assert first is not None and second is not None
    assert first.domain is second.domain is keys[0][0]
    assert isinstance(first, OneCounted) and isinstance(second, OneCounted)
    assert first.counter is states[0] and second.counter is states[1]  # kept for the next call


def test_swapping_rules_forgets_compiled_requests(tmp_path: Path) -> None:
    h = handler(tmp_path, rpu=1)
    body = raw("a")
    assert [code(h, body), code(h, body)] == [OK, OVER]
    h.swap_rules(load_rules(rules_file(tmp_path / "..", 100)))
    assert h._compiled.get(body) is None
    assert code(h, body) == OK  # matched against the new rule, a new counter


def test_unknown_domain_is_cached_and_answers_every_descriptor(tmp_path: Path) -> None:
    h = handler(tmp_path)
    body = request("nope", [("user", "a")], [("user", "b")]).SerializeToString()
    for _ in range(2):
        reply = wire.RateLimitResponse.FromString(answer_now(h, body))
        assert reply.overall_code == OK and len(reply.statuses) == 2
    compiled = h._compiled.get(body)
    assert compiled is not None and not compiled.known


def test_malformed_bytes_are_an_invalid_request_and_not_cached(tmp_path: Path) -> None:
    h = handler(tmp_path)
    with pytest.raises(InvalidRequest, match="malformed RateLimitRequest"):
        answer_now(h, b"\x0a\xff\xff")
    assert len(h._compiled) == 0


def test_a_flood_of_distinct_requests_stays_within_the_entry_bound(tmp_path: Path) -> None:
    h = handler(tmp_path, rpu=1000, entries=50)
    for i in range(500):
        assert code(h, raw(f"v{i}")) == OK
    assert 0 < len(h._compiled) <= 50
    assert h._compiled.clears == 9  # emptied once per 50 new requests after the first 50


def test_the_byte_bound_and_oversized_requests() -> None:
    cache = RequestCache(max_entries=1000, max_bytes=100)
    compiled = CompiledRequest("d", (), known=False)
    for i in range(10):
        cache.put(b"%02d" % i + b"x" * 38, compiled)  # 40 bytes each
    assert len(cache) == 2 and cache.clears == 4
    cache.put(b"y" * (MAX_REQUEST_BYTES + 1), compiled)
    assert cache.get(b"y" * (MAX_REQUEST_BYTES + 1)) is None

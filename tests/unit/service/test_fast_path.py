"""The fast path (service/fast_path.py) answers a request with one counted descriptor as the
general path would, for any request: the same bytes, the same counters in the limiter and in
the metrics. Checked at each of its steps (the decision, the encoding) and whole (the handler
with and without it)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from google.protobuf.wrappers_pb2 import UInt64Value
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.answer import answer_now
from ratelimit_sidecar._proto import wire
from ratelimit_sidecar.config.loader import load_rules
from ratelimit_sidecar.config.model import RateLimit, Rule, RuleSet, Unit
from ratelimit_sidecar.core import (
    Code,
    Decision,
    FleetLimiter,
    Hit,
    Limiter,
    LocalLimiter,
    PushResult,
    SyncResult,
    Verdict,
)
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.service.fast_path import OneCounted, admitted_answer, decide_one
from ratelimit_sidecar.service.ratelimit import RateLimitHandler
from ratelimit_sidecar.service.response import ResponseEncoder, ResponseOptions
from tests.unit.core.rules import hit, rule
from tests.unit.service.test_response import limits

T0 = 1_700_000_040_000
RULES = (rule(rpu=5, cooldown_ms=300), rule(rpu=1, key="x"), rule(rpu=40, spans=4, key="y"))
UNLIMITED = Rule("d", (("u", ""),), None, unlimited=True)
# Descriptors sent beside the counted one: none, unmatched, unlimited, or a second counted one.
COMPANIONS: tuple[tuple[Hit, ...], ...] = (
    (),
    (hit(None, "n"),),
    (hit(UNLIMITED, "u"), hit(None, "n")),
    (hit(RULES[1], "b"),),
)


def snapshot(limiter: Limiter) -> list[dict[str, object]]:
    return [state.snapshot() for state in limiter.keys]


def end_span(limiter: Limiter, now: int, total: int) -> None:
    """A span end: the store confirms `total` for every key (local-only: a sweep)."""
    if isinstance(limiter, LocalLimiter):
        limiter.sweep(now)
        return
    assert isinstance(limiter, FleetLimiter)
    batch = limiter.end_span(now)
    pushes = tuple(PushResult(total, 0) for _ in batch.pushes)
    totals = tuple(total for _ in batch.total_reads)
    nodes = 1 + total % 3  # new keys start from this estimate
    limiter.apply_sync(now, batch, SyncResult(pushes=pushes, totals=totals, live_nodes=nodes))


# One step: advance the clock by `dt` ms, then either send a request (rule index, value, hits,
# companions, counted first) or end a span with the store confirming a total for every key.
steps = st.lists(
    st.tuples(
        st.integers(0, 400),
        st.one_of(
            st.tuples(
                st.integers(0, 2),
                st.sampled_from("abc"),
                st.integers(-1, 3),
                st.integers(0, len(COMPANIONS) - 1),
                st.booleans(),
            ),
            st.tuples(st.just(-1), st.just(""), st.integers(0, 60), st.just(0), st.just(False)),
        ),
    ),
    max_size=80,
)


def fast_decision(
    limiter: Limiter, now: int, request: Sequence[Hit], at: int, kept: dict[object, OneCounted]
) -> Decision:
    """The fast path's decision of `request`, whose counted descriptor is at `at`; `kept`: the
    requests seen, as the handler keeps them (with their counters, evicted ones too)."""
    one = kept.setdefault(
        tuple(request), OneCounted("d", tuple(request), None, at, ResponseEncoder())
    )
    return one.decision(decide_one(limiter, now, one))


@settings(max_examples=200, deadline=None)
@given(steps, st.sampled_from([2, 4, 100]), st.booleans())
def test_the_counted_descriptor_alone_decides_as_the_whole_request(
    script: list[tuple[int, tuple[int, str, int, int, bool]]], max_keys: int, shared: bool
) -> None:
    """The same verdicts and counters as `Limiter.hit`, at span ends and evictions too (a small
    table also exercises the untracked decision of a full table)."""
    kind = FleetLimiter if shared else LocalLimiter
    alone, whole, now = kind(max_keys), kind(max_keys), T0
    kept: dict[object, OneCounted] = {}
    for dt, (index, value, count, companions, first) in script:
        now += dt
        if index < 0:
            end_span(alone, now, count)
            end_span(whole, now, count)
            continue
        counted, others = hit(RULES[index], value, count), list(COMPANIONS[companions])
        request = [counted, *others] if first else [*others, counted]
        at = 0 if first else len(others)
        single = companions != 3  # a second counted descriptor: the general path decides
        mine = fast_decision(alone, now, request, at, kept) if single else alone.hit(now, request)
        assert mine == whole.hit(now, request)
        assert snapshot(alone) == snapshot(whole)
    assert alone.dropped_hits == whole.dropped_hits
    assert (alone.untracked, alone.keys.evictions) == (whole.untracked, whole.keys.evictions)


# -- the encoding ---------------------------------------------------------------------------

UNLIMITED_HIT, UNMATCHED_HIT = hit(UNLIMITED, "u"), hit(None, "n")
admitted_verdicts = st.builds(
    Verdict,
    code=st.just(Code.OK),
    limit=limits,
    remaining=st.integers(0, 2**32 - 1) | st.integers(0, 300),
    reset_ms=st.integers(-3000, 10**10) | st.integers(0, 5000),
    near_limit=st.booleans(),
    shadow=st.booleans(),
)
constants = st.lists(st.sampled_from([UNLIMITED_HIT, UNMATCHED_HIT]), max_size=2)


@given(st.lists(st.tuples(constants, admitted_verdicts, constants)))
def test_the_admitted_answer_is_the_general_encoding(
    answers: list[tuple[list[Hit], Verdict, list[Hit]]],
) -> None:
    """One encoder for every answer: what it keeps encoded (reset fields per second, a count's
    high bits) carries from one to the next, and must never change the bytes."""
    encoder = ResponseEncoder()
    for before, verdict, after in answers:
        assert verdict.limit is not None
        counted = hit(Rule("d", (("k", ""),), verdict.limit), "v")
        one = OneCounted("d", (*before, counted, *after), None, len(before), encoder)
        fast = admitted_answer(encoder, one, verdict)
        assert fast == encoder.encode(one.decision(verdict))


def test_an_admitted_status_reports_its_limit_remaining_and_whole_seconds_to_reset() -> None:
    limit = RateLimit(10, Unit.MINUTE)
    encoder = ResponseEncoder()
    one = OneCounted(
        "d", (hit(Rule("d", (("k", ""),), limit, shadow_mode=True)),), None, 0, encoder
    )
    verdict = Verdict(Code.OK, limit, remaining=7, reset_ms=29_001, shadow=True)
    [status] = wire.RateLimitResponse.FromString(admitted_answer(encoder, one, verdict)).statuses
    assert (status.code, status.current_limit.requests_per_unit) == (wire.Code.OK, 10)
    assert (status.limit_remaining, status.duration_until_reset.seconds) == (7, 30)


# -- the handler, with and without the fast path ---------------------------------------------

HANDLER_RULES = """\
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: per-user}
  - key: burst
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: token_bucket}
  - key: slide
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: sliding_window}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: both
    rate_limits: [{unit: second, requests_per_unit: 2}, {unit: minute, requests_per_unit: 4}]
  - key: denied
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
"""
KEYS = ("user", "burst", "slide", "trial", "both", "denied", "free", "nothing")
OPTIONS = (
    ResponseOptions(),
    ResponseOptions(shadow_mode=True),
    ResponseOptions(quota_mode=True),
    ResponseOptions(ietf_headers=True),
)
# A descriptor: its key, its value, its own hits_addend (None: the request's), given back, and a
# limit of its own (requests per minute; None: the rules').
descriptors = st.tuples(
    st.sampled_from(KEYS),
    st.sampled_from("ab"),
    st.none() | st.integers(0, 3),
    st.booleans(),
    st.none() | st.integers(0, 3),
)
# One step: advance the clock by `dt` ms, then send a request (descriptors, hits_addend).
requests = st.lists(
    st.tuples(
        st.integers(0, 700),
        st.lists(descriptors, min_size=1, max_size=3),
        st.integers(0, 2),
    ),
    max_size=40,
)
Descriptor = tuple[str, str, int | None, bool, int | None]


def encoded(descriptors: Sequence[Descriptor], hits_addend: int) -> bytes:
    message = wire.RateLimitRequest(domain="d", hits_addend=hits_addend)
    for key, value, hits, negative, own_limit in descriptors:
        descriptor = message.descriptors.add()
        descriptor.entries.add(key=key, value=value)
        if hits is not None:
            descriptor.hits_addend.CopyFrom(UInt64Value(value=hits))
        descriptor.is_negative_hits = negative
        if own_limit is not None:
            descriptor.limit.requests_per_unit = own_limit
            descriptor.limit.unit = wire.RateLimitUnit.MINUTE
    return message.SerializeToString()


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


@pytest.fixture(scope="module")
def handler_rules(tmp_path_factory: pytest.TempPathFactory) -> RuleSet:
    path = tmp_path_factory.mktemp("rules") / "d.yaml"
    path.write_text(HANDLER_RULES)
    return load_rules(path)


def decision_counts(handler: RateLimitHandler) -> dict[tuple[str, str], tuple[int, ...]]:
    """The metrics' decision counters of each rule."""
    observer = handler._observer
    assert isinstance(observer, Metrics)
    by_rule = observer.decisions.by_rule.items()
    return {k: (c.total, c.within, c.near, c.over, c.shadow) for k, c in by_rule}


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("shared", [True, False])
@settings(max_examples=60, deadline=None)
@given(script=requests)
def test_the_handler_answers_the_same_bytes_and_counts_with_the_fast_path_as_without(
    handler_rules: RuleSet,
    options: ResponseOptions,
    shared: bool,
    script: list[tuple[int, list[Descriptor], int]],
) -> None:
    clock, kind = Clock(), FleetLimiter if shared else LocalLimiter
    fast, general = (
        RateLimitHandler(
            handler_rules, kind(), clock, options=options, observer=Metrics(), fast_path=fast
        )
        for fast in (True, False)
    )
    for dt, descriptors, hits_addend in script:
        clock.now += dt
        raw = encoded(descriptors, hits_addend)
        assert answer_now(fast, raw) == answer_now(general, raw)
        assert snapshot(fast.limiter) == snapshot(general.limiter)
    assert decision_counts(fast) == decision_counts(general)

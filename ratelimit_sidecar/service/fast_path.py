"""The fast path: the usual request, one counted descriptor, admitted.

The general path is the reference: `RateLimitHandler.respond_now` asks `Limiter.hit` about every
descriptor, the observer counts the whole `Decision`, and `ResponseEncoder.encode` encodes it.
Most requests Envoy sends have one descriptor with a limit (any others match no rule, or an
unlimited one: their statuses never change), and most of their answers admit it. For those,
this module takes the same steps with less work:

- it asks the limiter about the counted descriptor alone (`Limiter.check`, then the counter's
  algorithm's `count` and `admitted`: the steps `hit` takes for each), handing back the
  counter it got last time;
- it counts the metrics of that descriptor alone (`DecisionObserver.admitted`);
- it joins the answer from parts encoded when the request was first seen: the other
  descriptors' statuses, the counted one's code and limit. Only its count left and its reset
  change from one answer to the next.

A refusal leaves with its `Decision`, which the general path finishes. The bytes and the counts
are the general path's, for any request: tests/unit/service/test_fast_path.py. What the fast
path saves: docs/PERFORMANCE.md (hand-tuned spots).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ratelimit_sidecar.core import Decision, Hit, Limiter, Verdict, unlimited_verdict
from ratelimit_sidecar.core.limiter import Counter
from ratelimit_sidecar.core.types import OK
from ratelimit_sidecar.metrics.hot import Tally
from ratelimit_sidecar.service.compiled import CompiledRequest
from ratelimit_sidecar.service.observer import DecisionObserver
from ratelimit_sidecar.service.response import ResponseEncoder, ResponseOptions, varint


class OneCounted(CompiledRequest):
    """A compiled request whose only descriptor with a limit is at `index` (a single limit),
    and the parts of its admitted answer that never change: `opening` (the answer up to that
    descriptor's status: the overall code, the statuses before it, its status's tag), `head`
    (its status's start: the code, the limit) and `closing` (the statuses after it).
    `counter`: the key's counter, kept for the next decision (None: not known yet)."""

    __slots__ = (
        "closing",
        "counter",
        "head",
        "hits_addend",
        "index",
        "key",
        "limit",
        "opening",
        "rule",
    )

    def __init__(
        self,
        domain: str,
        hits: tuple[Hit, ...],
        tally: Tally | None,
        index: int,
        encoder: ResponseEncoder,
    ) -> None:
        super().__init__(domain, hits, True, tally)
        rule, self.key, self.hits_addend = hits[index]
        assert rule is not None and rule.limit is not None  # a counted descriptor has a limit
        self.index, self.rule, self.limit = index, rule, rule.limit
        self.opening = encoder.ok_opening(self._others_verdicts()[:index])
        self.head = encoder.admitted_head(rule.limit)
        self.closing = encoder.statuses(self._others_verdicts()[index + 1 :])
        self.counter: Counter = None

    def decision(self, verdict: Verdict) -> Decision:
        """The whole request's decision, with `verdict` for the counted descriptor."""
        verdicts = self._others_verdicts()
        verdicts[self.index] = verdict
        return Decision(verdict.code, tuple(verdicts))

    def _others_verdicts(self) -> list[Verdict]:
        """The verdicts of the descriptors no limit applies to, which never change (and a
        placeholder for the counted one's)."""
        return [unlimited_verdict(hit.rule) for hit in self.hits]


class FastPath:
    """Answers a handler's requests that have one counted descriptor. `enabled` False: it
    answers none (tests compare the general path's answers with this one's)."""

    def __init__(
        self,
        limiter: Limiter,
        encoder: ResponseEncoder,
        observer: DecisionObserver | None,
        *,
        enabled: bool = True,
    ) -> None:
        self._limiter = limiter
        self._encoder = encoder
        # Bound once: called through the Protocol, the method would be looked up by name.
        self._count_admitted: Callable[[Tally, int, Verdict], None] | None = (
            None if observer is None else observer.admitted
        )
        self._enabled = enabled and _constant_statuses(encoder.options)

    def compile(self, domain: str, hits: tuple[Hit, ...], tally: Tally | None) -> OneCounted | None:
        """The request as the fast path keeps it, if it has one counted descriptor (of a known
        domain, without a strict limit); None if it has several, or one with several limits,
        or none: the general path answers it."""
        index = _only_counted(hits) if self._enabled else -1
        return None if index < 0 else OneCounted(domain, hits, tally, index, self._encoder)

    def answer(self, now_ms: int, one: OneCounted) -> bytes | Decision:
        """The admitted answer's bytes; for a refusal, the decision the general path answers."""
        verdict = decide_one(self._limiter, now_ms, one)
        if verdict.code is not OK or verdict.shadow_refused:
            return one.decision(verdict)
        if self._count_admitted is not None and one.tally is not None:
            self._count_admitted(one.tally, one.index, verdict)
        return admitted_answer(self._encoder, one, verdict)


def decide_one(limiter: Limiter, now_ms: int, one: OneCounted) -> Verdict:
    """`Limiter.hit`'s verdict for the counted descriptor, with the same counts: the others'
    never change."""
    hits = one.hits_addend
    verdict, counter = limiter.check(now_ms, one.rule, one.limit, one.key, hits, one.counter)
    one.counter = counter
    if counter is None or (verdict is not None and verdict.code is not OK):
        assert verdict is not None  # a descriptor without a counter has its verdict
        return verdict
    algorithm = limiter.algorithm_of(counter)
    if hits:  # admitted, or over a shadow rule: counted either way
        algorithm.count(counter, hits, now_ms)
    return algorithm.admitted(counter, now_ms) if verdict is None else verdict


def admitted_answer(encoder: ResponseEncoder, one: OneCounted, verdict: Verdict) -> bytes:
    """`ResponseEncoder.encode`'s bytes for the admitted `verdict` of the counted descriptor:
    its status's length (its tag ends `opening`), then its fields."""
    remaining = encoder.remaining_field(verdict.remaining)
    reset = encoder.reset_field(verdict.reset_ms)
    length = varint(len(one.head) + len(remaining) + len(reset))
    return b"".join((one.opening, length, one.head, remaining, reset, one.closing))


def _only_counted(hits: Sequence[Hit]) -> int:
    """The index of the only descriptor a limit applies to; -1 if none, or several, or one
    answered by several limits."""
    found = -1
    for index, hit in enumerate(hits):
        if hit.rule is not None and hit.rule.limit is not None:
            if found >= 0 or len(hit.rule.limits) > 1:
                return -1
            found = index
    return found


def _constant_statuses(options: ResponseOptions) -> bool:
    """Without headers computed from every status, or dynamic metadata, the other descriptors'
    part of an admitted answer never changes."""
    headers = options.ietf_headers or options.reference_headers is not None
    return not (headers or options.dynamic_metadata)

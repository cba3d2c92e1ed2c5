"""The overall code of a refused request, as the reference service settles it.

The limiter refuses a request when any descriptor is over its limit, and then counts nothing.
Two settings of the reference let such a request through while every descriptor keeps its own
status (OVER_LIMIT, its limit and its reset, so Envoy's x-ratelimit-* headers stay true):

- quota mode (a descriptor's `quota_mode`, or `--quota-mode` for every descriptor that is not
  unlimited): a quota descriptor over its limit refuses the request only if every quota
  descriptor of the request is over; other descriptors over their limits still refuse it;
- the global `--shadow-mode`: a refused request is answered OK.

A request let through is then counted like an admitted one: the descriptors within their limits
are decided again, which counts their hits (the refused ones stay as the limiter answered them).
Only refused requests come here, so admitted requests pay nothing for either setting.
"""

from __future__ import annotations

from collections.abc import Sequence

from ratelimit_sidecar.core import Code, Decision, Hit, Limiter, Verdict


class OverallCode:
    """Settles refused decisions under the quota and global shadow settings."""

    def __init__(
        self,
        limiter: Limiter,
        *,
        shadow_mode: bool,
        quota_mode: bool,
        strict_in_store: bool = False,
    ) -> None:
        self.limiter = limiter
        self.shadow_mode = shadow_mode
        self.quota_mode = quota_mode
        # Strict limits are counted by the store's check, all or nothing, never by the limiter:
        # a request let through does not count them again here.
        self.strict_in_store = strict_in_store

    def settle(self, now_ms: int, hits: Sequence[Hit], refused: Decision) -> Decision:
        """`refused` as it stands, or admitted (and counted) if quota or shadow mode say so."""
        if not self.shadow_mode and refuses(hits, refused.verdicts, self.quota_mode):
            return refused
        return Decision(Code.OK, self._count_the_others(now_ms, hits, refused.verdicts))

    def _count_the_others(
        self, now_ms: int, hits: Sequence[Hit], verdicts: tuple[Verdict, ...]
    ) -> tuple[Verdict, ...]:
        within = [
            i
            for i, v in enumerate(verdicts)
            if v.code is Code.OK and _counted(hits[i], self.strict_in_store)
        ]
        if not within:
            return verdicts
        again = self.limiter.hit(now_ms, [hits[i] for i in within])
        settled = list(verdicts)
        for index, verdict in zip(within, again.verdicts, strict=True):
            settled[index] = verdict
        return tuple(settled)


def refuses(hits: Sequence[Hit], verdicts: Sequence[Verdict], quota_everywhere: bool) -> bool:
    """True if the request is refused: a descriptor outside quota mode is over its limit, or
    the request has quota descriptors and every one of them is over."""
    over_rate = over_quota = quotas = 0
    for hit, verdict in zip(hits, verdicts, strict=True):
        rule = hit.rule
        if rule is not None and rule.unlimited:
            continue  # never a quota descriptor, never over
        quota = quota_everywhere or (
            rule is not None and rule.limit is not None and rule.quota_mode
        )
        over = verdict.code is Code.OVER_LIMIT
        quotas += quota
        over_quota += over and quota
        over_rate += over and not quota
    return over_rate > 0 or (quotas > 0 and over_quota == quotas)


def _counted(hit: Hit, strict_in_store: bool) -> bool:
    rule = hit.rule
    if rule is None or rule.limit is None or hit.hits == 0:
        return False
    return not (strict_in_store and any(limit.strict for limit in rule.limits))

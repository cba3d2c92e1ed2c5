"""The overall code of a refused request, as the reference settles it.

A refused request counts nothing; two settings let it through, each descriptor keeping its status
(so x-ratelimit-* stay true): quota mode (`quota_mode`, or `--quota-mode` for all limited
descriptors: quota descriptors refuse only if all are over) and global `--shadow-mode`. Let
through, the descriptors within limits are decided again, which counts them. Admitted requests
pay nothing for either.
"""

from __future__ import annotations

from collections.abc import Sequence

from ratelimit_sidecar.core import Code, Decision, Hit, Limiter, Verdict


class OverallCode:
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
    """A non-quota descriptor is over, or every quota descriptor is."""
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

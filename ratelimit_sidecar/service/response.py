"""Builds the RateLimitResponse Envoy sees from a core Decision.

Envoy matches statuses to its descriptors by index, computes its `x-ratelimit-*` headers from
the statuses (the one with the least `limit_remaining` wins), and on OVER_LIMIT sends our
`response_headers_to_add` and `raw_body` to the client.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ratelimit_sidecar.config.model import RateLimit
from ratelimit_sidecar.core import Code, Decision, Verdict
from ratelimit_sidecar.wire import DescriptorStatus, HeaderValue, RateLimitResponse
from ratelimit_sidecar.wire import RateLimit as WireLimit

UNLIMITED_REMAINING = 2**32 - 1
_OK = RateLimitResponse.Code.OK
_OVER = RateLimitResponse.Code.OVER_LIMIT


@dataclass(frozen=True, slots=True)
class ResponseOptions:
    ietf_headers: bool = False  # add RateLimit-Policy / RateLimit (draft-ietf-httpapi)


def build_response(decision: Decision, options: ResponseOptions) -> RateLimitResponse:
    over = decision.code is Code.OVER_LIMIT
    response = RateLimitResponse(overall_code=_OVER if over else _OK)
    response.statuses.extend([_status(v) for v in decision.verdicts])
    if over:
        _add_rejection(response, decision)
    if options.ietf_headers:
        _add_ietf_headers(response, decision)
    return response


def unmatched_response(count: int) -> RateLimitResponse:
    """OK for every descriptor: the domain has no rules (an unknown domain)."""
    response = RateLimitResponse(overall_code=_OK)
    response.statuses.extend([DescriptorStatus(code=_OK) for _ in range(count)])
    return response


def _status(verdict: Verdict) -> DescriptorStatus:
    code = _OVER if verdict.code is Code.OVER_LIMIT else _OK
    limit = verdict.limit
    if verdict.shadow:  # not enforced, so not reported: Envoy's x-ratelimit-* stay truthful
        return DescriptorStatus(code=_OK)
    if limit is None:
        if verdict.unlimited:
            return DescriptorStatus(code=code, limit_remaining=UNLIMITED_REMAINING)
        return DescriptorStatus(code=code)
    status = DescriptorStatus(
        code=code, current_limit=_wire_limit(limit), limit_remaining=verdict.remaining
    )
    status.duration_until_reset.FromMilliseconds(max(0, verdict.reset_ms))
    return status


def _wire_limit(limit: RateLimit) -> WireLimit:
    wire = WireLimit(name=limit.name, requests_per_unit=limit.requests_per_unit)
    wire.unit = int(limit.unit)  # type: ignore[assignment]  # same numbers as our Unit
    if limit.unit_multiplier > 1:
        wire.unit_multiplier.value = limit.unit_multiplier
    return wire


def retry_after_seconds(decision: Decision) -> int:
    """Whole seconds, at least 1, rounded up so a client that waits is not rejected again."""
    return max(1, -(-decision.retry_after_ms // 1000))


def _first_over(decision: Decision) -> Verdict:
    return next(v for v in decision.verdicts if v.code is Code.OVER_LIMIT)


def _add_rejection(response: RateLimitResponse, decision: Decision) -> None:
    retry = retry_after_seconds(decision)
    verdict = _first_over(decision)
    response.response_headers_to_add.extend(
        [
            HeaderValue(key="retry-after", value=str(retry)),
            HeaderValue(key="content-type", value="application/json"),
        ]
    )
    response.raw_body = _body(verdict.limit, retry)


def _body(limit: RateLimit | None, retry: int) -> bytes:
    error: dict[str, object] = {
        "code": "RATE_LIMITED",
        "message": f"Too many requests; retry in {retry} s.",
        "retry_after": retry,
    }
    if limit is not None:
        error["limit"] = limit.requests_per_unit
        error["window"] = limit.window_seconds
        if limit.name:
            error["name"] = limit.name
    return json.dumps({"error": error}, separators=(",", ":")).encode()


def _add_ietf_headers(response: RateLimitResponse, decision: Decision) -> None:
    """`RateLimit-Policy` and `RateLimit` for the most constrained limited descriptor."""
    limited = [v for v in decision.verdicts if v.limit is not None and not v.shadow]
    if not limited:
        return
    tightest = min(limited, key=lambda v: (v.remaining, v.reset_ms))
    limit = tightest.limit
    assert limit is not None
    reset = max(0, -(-tightest.reset_ms // 1000))
    policy = f'"{_policy_name(limit)}";q={limit.requests_per_unit};w={limit.window_seconds}'
    state = f'"{_policy_name(limit)}";r={tightest.remaining};t={reset}'
    response.response_headers_to_add.extend(
        [
            HeaderValue(key="ratelimit-policy", value=policy),
            HeaderValue(key="ratelimit", value=state),
        ]
    )


def _policy_name(limit: RateLimit) -> str:
    name = limit.name or "default"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)

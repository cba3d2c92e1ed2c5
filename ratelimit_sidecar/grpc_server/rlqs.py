"""The Rate Limit Quota Service on the gRPC server of ShouldRateLimit: a thin servicer.

`envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`: one stream per
Envoy. Each usage report is handed to the stream's `QuotaStream` (service/quota.py, where every
rule lives) and its answer sent back at once, as one response holding only the buckets that
need telling; a DENY_ALL whose block ends is decided again then, without waiting for a report.
A bad report ends the stream with INVALID_ARGUMENT and the reason; shutdown ends every stream
with OK, after the reports already received are counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import grpc
from google.protobuf.duration_pb2 import Duration
from prometheus_client import CollectorRegistry, Counter, Gauge

from ratelimit_sidecar._proto.envoy.service.rate_limit_quota.v3.rlqs_pb2 import (
    BucketId,
    RateLimitQuotaResponse,
    RateLimitQuotaUsageReports,
)
from ratelimit_sidecar._proto.envoy.type.v3.ratelimit_strategy_pb2 import RateLimitStrategy
from ratelimit_sidecar._proto.envoy.type.v3.token_bucket_pb2 import TokenBucket
from ratelimit_sidecar.config.model import RuleSet
from ratelimit_sidecar.core import Limiter
from ratelimit_sidecar.core.quota_assign import Action, Assignment, QuotaPolicy
from ratelimit_sidecar.metrics.labels import NS
from ratelimit_sidecar.overrides.applied import NO_OVERRIDES, AppliedOverrides
from ratelimit_sidecar.service.quota import BucketAction, QuotaService, QuotaStream, Usage
from ratelimit_sidecar.service.validation import Bounds, InvalidRequest

log = logging.getLogger("ratelimit_sidecar.rlqs")

SERVICE_NAME = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"
METHOD_PATH = f"/{SERVICE_NAME}/StreamRateLimitQuotas"
_BLANKETS = {
    Action.ALLOW_ALL: RateLimitStrategy.ALLOW_ALL,
    Action.DENY_ALL: RateLimitStrategy.DENY_ALL,
}
_END = object()  # the reader's mark: Envoy closed its side of the stream
# Reports read ahead of the one being answered: a full inbox stops the reader, so a gateway
# sending faster than its reports are answered waits in gRPC's flow control, not in memory.
INBOX_REPORTS = 2


class ServicerContext(Protocol):
    """The part of a call's context the servicer uses; grpc.aio's and the fast transport's
    (grpc_server/transport/calls.py) both have it."""

    async def write(self, message: Any) -> None: ...

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None: ...


class QuotaMetrics:
    """`rlqs_*` metrics; the service's QuotaObserver."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            f"{NS}_rlqs_requests",
            "Requests RLQS gateways reported, by their own decision",
            ("result",),
            registry=registry,
        )
        self.reports = Counter(
            f"{NS}_rlqs_reports", "Bucket usage reports received", registry=registry
        )
        self.assignments = Counter(
            f"{NS}_rlqs_assignments",
            "Bucket actions sent, by action",
            ("action",),
            registry=registry,
        )
        self.open_streams = Gauge(f"{NS}_rlqs_streams", "Open RLQS streams", registry=registry)
        self.deny_list_dropped = Counter(
            f"{NS}_rlqs_deny_list_abandoned",
            "Idle deny-list buckets abandoned: their stream held too many buckets to keep them",
            registry=registry,
        )

    def reported(self, allowed: int, denied: int) -> None:
        self.reports.inc()
        if allowed:
            self.requests.labels("allowed").inc(allowed)
        if denied:
            self.requests.labels("denied").inc(denied)

    def assigned(self, action: str) -> None:
        self.assignments.labels(action).inc()

    def streams(self, delta: int) -> None:
        self.open_streams.inc(delta)

    def deny_list_abandoned(self) -> None:
        self.deny_list_dropped.inc()


class QuotaServicer:
    """Converts messages to and from the service's plain values; keeps no rule of its own."""

    def __init__(self, service: QuotaService) -> None:
        self.service = service
        self._closing = asyncio.Event()

    def end_streams(self) -> None:
        """Shutdown: every stream answers what it has read, then ends with OK."""
        self._closing.set()

    async def StreamRateLimitQuotas(
        self,
        reports: AsyncIterator[RateLimitQuotaUsageReports],
        context: ServicerContext,
    ) -> None:
        stream = self.service.open_stream()
        inbox = _inbox()
        reader = asyncio.create_task(_read(reports, inbox))
        try:
            await self._serve(stream, inbox, context)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception:
            log.exception("StreamRateLimitQuotas failed")
            await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the sidecar log")
        finally:
            reader.cancel()
            stream.close()

    async def _serve(
        self, stream: QuotaStream, inbox: asyncio.Queue[object], context: ServicerContext
    ) -> None:
        """Answer each report; between reports, wake for the next recheck (a block ends, a
        window frees room). A response's actions apply in order: the report's come first, and a
        recheck after them sees what they sent."""
        while not self._closing.is_set():
            message = await self._next(stream, inbox)
            if message is _END:
                return
            actions = []
            if isinstance(message, RateLimitQuotaUsageReports):
                actions = stream.report(message.domain, _usages(message))
            actions += stream.due()
            if actions:
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("rlqs %s: %s", stream.domain, "; ".join(map(_describe, actions)))
                await context.write(_response(actions))

    async def _next(self, stream: QuotaStream, inbox: asyncio.Queue[object]) -> object:
        """The next report, or None when a recheck (or shutdown) comes first."""
        recheck = stream.next_recheck_ms()
        timeout = None if recheck is None else max(0, recheck - self.service.clock_ms()) / 1000
        getter = asyncio.ensure_future(inbox.get())
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            done, _ = await asyncio.wait(
                {getter, closing}, timeout=timeout, return_when="FIRST_COMPLETED"
            )
        except BaseException:  # grpc cancelled the call (Envoy gone): no wait may outlive it
            getter.cancel()
            raise
        finally:
            closing.cancel()
        if getter in done:
            return getter.result()
        getter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await getter
        if not getter.cancelled():  # a report arrived as the wait ended: keep it
            return getter.result()
        return _END if closing in done else None


async def _read(
    reports: AsyncIterator[RateLimitQuotaUsageReports], inbox: asyncio.Queue[object]
) -> None:
    """Envoy's reports into `inbox`, then the end mark; a broken stream (Envoy gone, the call
    cancelled) is an end like any other."""
    try:
        async for report in reports:
            await inbox.put(report)  # waits while the inbox is full
    except (grpc.RpcError, grpc.aio.UsageError, OSError):
        pass
    await inbox.put(_END)  # not when cancelled: the handler that would read it has ended


def _inbox() -> asyncio.Queue[object]:
    return asyncio.Queue(maxsize=INBOX_REPORTS)


def _usages(message: RateLimitQuotaUsageReports) -> list[Usage]:
    return [
        Usage(dict(u.bucket_id.bucket), u.num_requests_allowed, u.num_requests_denied)
        for u in message.bucket_quota_usages
    ]


def _describe(action: BucketAction) -> str:
    """One action for the debug log; bucket values may be API keys: their keys only."""
    keys = ",".join(key for key, _ in action.bucket)
    a = action.assignment
    if a.action is Action.ABANDON:
        return f"{keys} abandon"
    numbers = "" if a.bucket is None else f" {a.bucket.max_tokens}+{a.bucket.tokens_per_fill}"
    return f"{keys} {a.action.value}{numbers} ttl {a.ttl_s}s"


def _response(actions: Sequence[BucketAction]) -> RateLimitQuotaResponse:
    response = RateLimitQuotaResponse()
    for action in actions:
        bucket_id = BucketId(bucket=dict(action.bucket))
        assignment = action.assignment
        if assignment.replaces_bucket:
            # Envoy applies a response's actions in order and only then shows the result to
            # its workers: after a blanket rule, the token bucket is built full.
            out = response.bucket_action.add(bucket_id=bucket_id)
            _assignment(out.quota_assignment_action, Assignment(Action.DENY_ALL, 1, 0))
        out = response.bucket_action.add(bucket_id=bucket_id)
        if assignment.action is Action.ABANDON:
            out.abandon_action.SetInParent()
        else:
            _assignment(out.quota_assignment_action, assignment)
    return response


def _assignment(
    out: RateLimitQuotaResponse.BucketAction.QuotaAssignmentAction, a: Assignment
) -> None:
    out.assignment_time_to_live.CopyFrom(Duration(seconds=a.ttl_s))
    strategy = out.rate_limit_strategy
    if a.bucket is None:
        strategy.blanket_rule = _BLANKETS[a.action]
        return
    bucket = TokenBucket(max_tokens=a.bucket.max_tokens)
    bucket.tokens_per_fill.value = a.bucket.tokens_per_fill
    bucket.fill_interval.CopyFrom(Duration(seconds=a.bucket.fill_interval_s))
    strategy.token_bucket.CopyFrom(bucket)


def add_quota_service(server: Any, servicer: QuotaServicer) -> str:
    """Register StreamRateLimitQuotas on `server` (grpc.aio's or the fast transport's: both
    take grpc's generic handlers); returns the service name (for reflection)."""
    method = grpc.stream_stream_rpc_method_handler(
        servicer.StreamRateLimitQuotas,
        request_deserializer=RateLimitQuotaUsageReports.FromString,
        response_serializer=RateLimitQuotaResponse.SerializeToString,
    )
    methods = {"StreamRateLimitQuotas": method}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, methods),))
    return SERVICE_NAME


def quota_wiring(
    rules: Callable[[], RuleSet],
    limiter: Limiter,
    clock_ms: Callable[[], int],
    registry: CollectorRegistry,
    *,
    bounds: Bounds,
    policy: QuotaPolicy,
    overrides: Callable[[], AppliedOverrides] = lambda: NO_OVERRIDES,
) -> tuple[QuotaServicer, Callable[[Any], str]]:
    """The sidecar's RLQS servicer, on its rules and runtime overrides (read at each report: a
    change applies at the next one), limiter and metrics registry, and the hook that adds it to
    the gRPC server of ShouldRateLimit. Reports are held to the request `bounds`."""
    service = QuotaService(
        rules,
        limiter,
        clock_ms,
        bounds=bounds,
        policy=policy,
        observer=QuotaMetrics(registry),
        overrides=overrides,
    )
    servicer = QuotaServicer(service)
    return servicer, lambda server: add_quota_service(server, servicer)

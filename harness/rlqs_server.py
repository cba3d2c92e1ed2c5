"""A scripted Rate Limit Quota Service for tests: records every report, answers what it is told.

Envoy's `rate_limit_quota` filter keeps one stream open and streams usage reports on it; the
server may send bucket actions at any time. This server runs `grpc.aio` on a thread of its own,
so synchronous tests drive it: `answer()` sets what every report of a bucket gets back,
`push()` sends at once on every open stream, `stop()` and `start()` make it unreachable and
back on the same port. Every report is kept with the time it arrived.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from harness.net import free_port
from ratelimit_sidecar._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from ratelimit_sidecar._proto.envoy.type.v3 import ratelimit_strategy_pb2, token_bucket_pb2

Reports = rlqs_pb2.RateLimitQuotaUsageReports
Response = rlqs_pb2.RateLimitQuotaResponse
Action = Response.BucketAction
Strategy = ratelimit_strategy_pb2.RateLimitStrategy
BucketKey = tuple[tuple[str, str], ...]
START_TIMEOUT_S = 10.0
add_servicer: Callable[[Any, Any], None] = rlqs_pb2_grpc.add_RateLimitQuotaServiceServicer_to_server


def bucket_key(entries: Mapping[str, str]) -> BucketKey:
    """A bucket id as a hashable value: its entries sorted (Envoy ids are maps)."""
    return tuple(sorted(entries.items()))


@dataclass(frozen=True)
class Usage:
    bucket: BucketKey
    elapsed_s: float
    allowed: int
    denied: int


@dataclass(frozen=True)
class Report:
    at: float  # time.monotonic() when it arrived
    stream: int  # streams are numbered from 0 in the order they opened
    domain: str
    usages: tuple[Usage, ...]


def _usage(message: Any) -> Usage:
    elapsed = message.time_elapsed.seconds + message.time_elapsed.nanos / 1e9
    key = bucket_key(dict(message.bucket_id.bucket))
    return Usage(key, elapsed, message.num_requests_allowed, message.num_requests_denied)


def assignment(strategy: Any, ttl_s: float | None) -> Any:
    """A QuotaAssignmentAction; `ttl_s` None leaves assignment_time_to_live unset."""
    action = Action.QuotaAssignmentAction(rate_limit_strategy=strategy)
    if ttl_s is not None:
        action.assignment_time_to_live.FromNanoseconds(int(ttl_s * 1e9))
    return action


def blanket(rule: str) -> Any:
    return Strategy(blanket_rule=rule)


def token_bucket(max_tokens: int, fill_s: float, tokens_per_fill: int | None = None) -> Any:
    bucket = token_bucket_pb2.TokenBucket(max_tokens=max_tokens)
    bucket.fill_interval.FromNanoseconds(int(fill_s * 1e9))
    if tokens_per_fill is not None:
        bucket.tokens_per_fill.value = tokens_per_fill
    return Strategy(token_bucket=bucket)


def action(key: BucketKey, quota: Any = None, *, abandon: bool = False) -> Any:
    """A BucketAction for `key`: the assignment `quota`, or abandon."""
    bucket_id = rlqs_pb2.BucketId(bucket=dict(key))
    if abandon:
        return Action(bucket_id=bucket_id, abandon_action=Action.AbandonAction())
    return Action(bucket_id=bucket_id, quota_assignment_action=quota)


class _Servicer(rlqs_pb2_grpc.RateLimitQuotaServiceServicer):
    def __init__(self, owner: ScriptedRlqsServer) -> None:
        self.owner = owner

    async def StreamRateLimitQuotas(
        self, request_iterator: AsyncIterator[Any], _context: Any
    ) -> AsyncIterator[Any]:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stream = self.owner._open(queue)
        reader = asyncio.create_task(self._read(request_iterator, stream, queue))
        try:
            while (response := await queue.get()) is not None:
                yield response
        finally:
            reader.cancel()
            self.owner._close(stream)

    async def _read(self, requests: AsyncIterator[Any], stream: int, queue: Any) -> None:
        async for message in requests:
            reply = self.owner._record(stream, message)
            if reply.bucket_action:
                queue.put_nowait(reply)
        queue.put_nowait(None)


class ScriptedRlqsServer:
    """RLQS on 127.0.0.1:`port`; `answer`/`push` script it, `reports` is what Envoy sent."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._lock = threading.Lock()
        self._reports: list[Report] = []
        self._answers: dict[BucketKey, Any] = {}
        self._queues: dict[int, asyncio.Queue[Any]] = {}  # open streams by number
        self._domains: dict[int, str] = {}  # what each stream's reports said
        self._streams_opened = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None

    # --- scripting -------------------------------------------------------------------------

    def answer(self, entries: Mapping[str, str], quota: Any) -> None:
        """Every report of this bucket is answered with assignment `quota` (None: no answer;
        a list: several actions for it, in order, in one response)."""
        with self._lock:
            self._answers[bucket_key(entries)] = quota

    def push(self, *actions: Any) -> int:
        """Send these actions now on every open stream; how many streams got them."""
        loop, queues = self._loop, list(self._queues.values())
        if loop is None:
            return 0
        for queue in queues:
            loop.call_soon_threadsafe(queue.put_nowait, Response(bucket_action=list(actions)))
        return len(queues)

    def end_streams(self, domain: str | None = None) -> int:
        """End the open streams (of `domain`) with OK, the server staying up; how many."""
        loop = self._loop
        with self._lock:
            queues = [q for n, q in self._queues.items() if domain in (None, self._domains.get(n))]
        if loop is None:
            return 0
        for queue in queues:
            loop.call_soon_threadsafe(queue.put_nowait, None)
        return len(queues)

    # --- what Envoy sent -------------------------------------------------------------------

    @property
    def reports(self) -> list[Report]:
        with self._lock:
            return list(self._reports)

    def usages(self, entries: Mapping[str, str]) -> list[tuple[Report, Usage]]:
        """Every report of one bucket, in arrival order."""
        key = bucket_key(entries)
        return [(r, u) for r in self.reports for u in r.usages if u.bucket == key]

    def wait_for(
        self, done: Callable[[ScriptedRlqsServer], bool], timeout_s: float, what: str = ""
    ) -> None:
        """Poll `done(self)` every 50 ms; TimeoutError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not done(self):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what or 'condition'} not met in {timeout_s:g} s")
            time.sleep(0.05)

    @property
    def open_streams(self) -> int:
        return len(self._queues)

    # --- servicer callbacks (on the server's loop) -----------------------------------------

    def _open(self, queue: asyncio.Queue[Any]) -> int:
        with self._lock:
            self._queues[self._streams_opened] = queue
            self._streams_opened += 1
            return self._streams_opened - 1

    def _close(self, stream: int) -> None:
        with self._lock:
            self._queues.pop(stream, None)

    def _record(self, stream: int, message: Any) -> Any:
        usages = tuple(_usage(u) for u in message.bucket_quota_usages)
        reply = Response()
        with self._lock:
            self._reports.append(Report(time.monotonic(), stream, message.domain, usages))
            self._domains[stream] = message.domain
            for usage in usages:
                quota = self._answers.get(usage.bucket)
                for one in quota if isinstance(quota, list) else [quota]:
                    if one is not None:
                        reply.bucket_action.append(action(usage.bucket, one))
        return reply

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> ScriptedRlqsServer:
        """Serve on a thread of its own; returns once the port is bound."""
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(START_TIMEOUT_S) or self._server is None:
            raise RuntimeError(f"RLQS test server did not start on port {self.port}")
        return self

    def _run(self, ready: threading.Event) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve(ready))
        self._loop.run_forever()

    async def _serve(self, ready: threading.Event) -> None:
        server = grpc.aio.server()
        add_servicer(_Servicer(self), server)
        server.add_insecure_port(f"127.0.0.1:{self.port}")
        await server.start()
        self._server = server
        ready.set()

    def stop(self) -> None:
        """Close every stream and the port at once (Envoy sees the server gone)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        for queue in list(self._queues.values()):
            loop.call_soon_threadsafe(queue.put_nowait, None)
        asyncio.run_coroutine_threadsafe(self._server.stop(grace=0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        self._loop = self._thread = self._server = None
        self._queues.clear()

"""The admin API: runtime overrides over authenticated HTTP (docs/OVERRIDES.md).

Served on `--admin-address` only when a token is configured (`--admin-token-file`, else the
`RLS_ADMIN_TOKEN` environment variable); every request must carry `Authorization: Bearer
<token>`, compared in constant time. The token is held here alone: it is never a setting, never
logged, never shown. Writes go to the override store and are then applied on this node at once
(`OverrideKeeper.refresh`); other nodes follow through the store.

    GET    /v1/overrides[?domain=D]   {"version": N, "overrides": [...]}
    PUT    /v1/overrides              create or replace: {"id": ..., "version": N}
    GET    /v1/overrides/{id}         one override, 404 if none
    DELETE /v1/overrides/{id}         {"id": ..., "version": N}, 404 if none
    GET    /v1/overrides/history      the last 100 changes
    POST   /v1/overrides/rollback     {"version": N}: the set as at N becomes current
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ratelimit_sidecar.bind import BindError
from ratelimit_sidecar.http_server.admin_body import BodyError, history_view, json_body
from ratelimit_sidecar.http_server.admin_token import admin_token
from ratelimit_sidecar.http_server.server import HttpApi, Reply, Request, json_error, json_reply
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.overrides.keeper import OverrideKeeper, documents_by_domain
from ratelimit_sidecar.overrides.model import OverrideError, parse_override
from ratelimit_sidecar.overrides.store import OverrideSnapshot, OverrideStore, UnknownVersion
from ratelimit_sidecar.storage.errors import StoreError

log = logging.getLogger("ratelimit_sidecar.admin")

ADMIN_OFF = "off"  # --admin-address off: no admin API on this process (workers after the first)
MAX_BODY_BYTES = 64 * 1024
PREFIX = "/v1/overrides"
NO_STORE = (
    "overrides cannot be kept: no shared store (--redis-url) and no --state-dir; set one of them"
)


@dataclass(frozen=True, slots=True)
class AdminOptions:
    """Where the admin API listens (`ADMIN_OFF`: nowhere), and the file holding its token
    (None: the `RLS_ADMIN_TOKEN` variable; neither: the API stays closed)."""

    address: str
    token_file: str | None


class AdminServer:
    """The admin address: authentication, routing, the override calls."""

    def __init__(
        self,
        options: AdminOptions,
        keeper: OverrideKeeper,
        clock_ms: Callable[[], int],
        metrics: Metrics | None = None,
    ) -> None:
        self._options = options
        self._keeper = keeper
        self._clock_ms = clock_ms
        self._token: bytes | None = None
        self._write_lock = asyncio.Lock()  # one write and its refresh at a time
        observe = None if metrics is None else (lambda code: _count(metrics, code))
        self.http = HttpApi(
            dispatch=self.dispatch, max_body=MAX_BODY_BYTES, guard=self._guard, observe=observe
        )

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def describe(self) -> str:
        """For the start-up line."""
        if self._options.address == ADMIN_OFF:
            return "admin API off (--admin-address off)"
        if self._token is None:
            return "admin API off (no token: --admin-token-file or RLS_ADMIN_TOKEN)"
        host = self._options.address.rpartition(":")[0] or "127.0.0.1"
        return f"admin API on {host}:{self.http.port}"

    async def start(self) -> None:
        address = self._options.address
        if address == ADMIN_OFF:
            return
        self._token = admin_token(self._options.token_file)
        if self._token is None:
            return
        try:
            await self.http.start(address)
        except OSError as exc:
            raise BindError(f"cannot listen on {address} (admin): {exc.strerror}") from exc

    async def stop(self) -> None:
        await self.http.stop()

    def _guard(self, headers: dict[str, str]) -> Reply | None:
        """Before a body is read: a request without the token gets 401, whatever it sends."""
        if self._authorized(headers.get("authorization", "")):
            return None
        return json_error(401, "unauthorized", "missing or wrong bearer token")

    async def dispatch(self, request: Request) -> Reply:
        refused = self._guard(request.headers)
        if refused is not None:
            return refused
        path = request.path.rstrip("/") or "/"
        if path == PREFIX:
            return await self._collection(request)
        if path in (f"{PREFIX}/history", f"{PREFIX}/rollback"):
            return await self._action(request, path.rsplit("/", 1)[1])
        if path.startswith(PREFIX + "/") and "/" not in path[len(PREFIX) + 1 :]:
            return await self._one(request, path[len(PREFIX) + 1 :])
        return json_error(404, "not_found", "no such path")

    def _authorized(self, header: str) -> bool:
        scheme, _, presented = header.partition(" ")
        if self._token is None or scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(presented.strip().encode("latin-1"), self._token)

    async def _collection(self, request: Request) -> Reply:
        if request.method == "GET":
            domain = request.query.get("domain", [None])[0]
            snapshot = await self._guarded_read()
            if isinstance(snapshot, tuple):
                return snapshot
            documents = documents_by_domain(snapshot.documents, domain)
            return json_reply({"version": snapshot.version, "overrides": documents})
        if request.method == "PUT":
            return await self._put(request.body)
        return _not_allowed("GET, PUT")

    async def _one(self, request: Request, override_id: str) -> Reply:
        if request.method == "GET":
            snapshot = await self._guarded_read()
            if isinstance(snapshot, tuple):
                return snapshot
            document = snapshot.documents.get(override_id)
            if document is None:
                return json_error(404, "not_found", f"no override {override_id[:80]!r}")
            return json_reply(dict(document))
        if request.method == "DELETE":
            return await self._write(lambda store, now: store.delete(override_id, now), override_id)
        return _not_allowed("GET, DELETE")

    async def _action(self, request: Request, name: str) -> Reply:
        if name == "history":
            if request.method != "GET":
                return _not_allowed("GET")
            store = self._keeper.store
            try:
                changes = () if store is None else await store.history()
            except StoreError as exc:
                return _store_down(exc)
            return json_reply({"changes": history_view(changes)})
        if request.method != "POST":
            return _not_allowed("POST")
        try:
            version = _rollback_version(json_body(request.body))
        except BodyError as exc:
            return json_error(400, "bad_request", str(exc))
        return await self._write(lambda store, now: store.rollback(version, now), None)

    async def _put(self, body: bytes) -> Reply:
        try:
            override = parse_override(json_body(body), self._keeper.bounds)
        except (BodyError, OverrideError) as exc:
            return json_error(400, "invalid_override", str(exc))
        if override.expired(self._clock_ms()):
            return json_error(400, "invalid_override", "expires_at: already passed")
        document = override.document
        return await self._write(lambda store, now: store.put(document, now), override.id)

    async def _write(
        self,
        change: Callable[[OverrideStore, int], Awaitable[int | None]],
        override_id: str | None,
    ) -> Reply:
        """One write to the store, then the new set applied here before answering."""
        store = self._keeper.store
        if store is None:
            return json_error(409, "no_store", NO_STORE)
        async with self._write_lock:
            try:
                version = await change(store, self._clock_ms())
            except UnknownVersion as exc:
                return json_error(400, "unknown_version", str(exc))
            except StoreError as exc:
                return _store_down(exc)
            if version is None:
                return json_error(404, "not_found", f"no override {str(override_id)[:80]!r}")
            await self._keeper.refresh()
        answer: dict[str, object] = {"version": version}
        if override_id is not None:
            answer["id"] = override_id
        return json_reply(answer)

    async def _guarded_read(self) -> OverrideSnapshot | Reply:
        """The store's current set, or the 503 to answer."""
        store = self._keeper.store
        if store is None:
            return self._keeper.snapshot
        try:
            return await store.read()
        except StoreError as exc:
            return _store_down(exc)


def _rollback_version(body: object) -> int:
    if not isinstance(body, dict) or set(body) != {"version"}:
        raise BodyError('the body must be {"version": N}')
    version = body["version"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise BodyError("version: must be a non-negative integer")
    return version


def _not_allowed(allowed: str) -> Reply:
    return json_error(405, "method_not_allowed", f"allowed here: {allowed}")


def _store_down(exc: StoreError) -> Reply:
    log.warning("override store unavailable: %s", exc)
    return json_error(503, "store_unavailable", "the override store cannot be reached; retry")


def _count(metrics: Metrics, code: int) -> None:
    metrics.admin_requests.labels(str(code)).inc()

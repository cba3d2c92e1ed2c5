"""The admin API's routes and errors, called as the HTTP server calls them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from ratelimit_sidecar.http_server.admin import AdminOptions, AdminServer
from ratelimit_sidecar.http_server.admin_token import ADMIN_TOKEN_ENV
from ratelimit_sidecar.http_server.server import Request
from ratelimit_sidecar.metrics import Metrics
from ratelimit_sidecar.overrides.applied import AppliedOverrides
from ratelimit_sidecar.overrides.keeper import OverrideKeeper
from ratelimit_sidecar.overrides.model import OverrideBounds
from ratelimit_sidecar.overrides.store import MemoryOverrideStore

TOKEN = "t0ken-for-tests-0123456789"
T0 = 1_796_000_000_000
AUTH = {"authorization": f"Bearer {TOKEN}"}
BODY = {
    "domain": "gateway",
    "descriptor": [{"key": "api_key", "value": "k1"}],
    "rate_limit": {"unit": "minute", "requests_per_unit": 5},
}


class Admin:
    def __init__(self, server: AdminServer, applied: list[AppliedOverrides]) -> None:
        self.server, self.applied = server, applied

    async def call(
        self, method: str, path: str, body: object = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, object]]:
        raw = (
            b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        )
        path, _, query = path.partition("?")
        queries = {k: [v] for k, v in (p.split("=") for p in query.split("&") if p)}
        request = Request(method, path, queries, AUTH if headers is None else headers, raw)
        status, _, answer = await self.server.dispatch(request)
        return status, json.loads(answer)


async def _admin(store: MemoryOverrideStore | None) -> AsyncIterator[Admin]:
    applied: list[AppliedOverrides] = []
    keeper = OverrideKeeper(store, applied.append, lambda: T0, OverrideBounds())
    options = AdminOptions(address="127.0.0.1:0", token_file=None)
    server = AdminServer(options, keeper, lambda: T0, Metrics())
    await server.start()
    try:
        yield Admin(server, applied)
    finally:
        await server.stop()


@pytest.fixture
async def admin(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Admin]:
    monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
    async for found in _admin(MemoryOverrideStore()):
        yield found


@pytest.fixture
async def storeless(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Admin]:
    monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
    async for found in _admin(None):
        yield found


async def test_put_get_list_delete(admin: Admin) -> None:
    status, put = await admin.call("PUT", "/v1/overrides", BODY)
    assert status == 200 and put["version"] == 1
    override_id = str(put["id"])
    assert len(admin.applied[-1].rules) == 1  # applied on this node before the answer

    assert await admin.call("GET", f"/v1/overrides/{override_id}") == (
        200,
        {"id": override_id, **BODY},
    )
    status, listing = await admin.call("GET", "/v1/overrides?domain=gateway")
    assert (status, listing["version"], len(listing["overrides"])) == (200, 1, 1)  # type: ignore[arg-type]
    assert (await admin.call("GET", "/v1/overrides?domain=other"))[1]["overrides"] == []

    assert await admin.call("DELETE", f"/v1/overrides/{override_id}") == (
        200, {"id": override_id, "version": 2},
    )  # fmt: skip
    assert (await admin.call("DELETE", f"/v1/overrides/{override_id}"))[0] == 404
    assert (await admin.call("GET", f"/v1/overrides/{override_id}"))[0] == 404
    assert len(admin.applied[-1].rules) == 0


async def test_history_and_rollback(admin: Admin) -> None:
    await admin.call("PUT", "/v1/overrides", BODY)
    raised = {**BODY, "rate_limit": {"unit": "minute", "requests_per_unit": 50}}
    await admin.call("PUT", "/v1/overrides", raised)

    status, rolled = await admin.call("POST", "/v1/overrides/rollback", {"version": 1})
    _, history = await admin.call("GET", "/v1/overrides/history")
    _, listing = await admin.call("GET", "/v1/overrides")

    assert (status, rolled) == (200, {"version": 3})
    changes = history["changes"]
    assert isinstance(changes, list)
    assert [c["action"] for c in changes] == ["rollback", "put", "put"]
    assert changes[0]["time"] == "2026-11-30T00:53:20.000Z"
    assert changes[0]["overrides"][0]["after"]["rate_limit"]["requests_per_unit"] == 5
    assert listing["overrides"][0]["rate_limit"]["requests_per_unit"] == 5  # type: ignore[index]
    assert (await admin.call("POST", "/v1/overrides/rollback", {"version": 99}))[0] == 400


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}, {"authorization": "Basic x"}],
)
async def test_every_call_needs_the_token(admin: Admin, headers: dict[str, str]) -> None:
    for method, path in (("GET", "/v1/overrides"), ("PUT", "/v1/overrides"), ("GET", "/nope")):
        status, answer = await admin.call(method, path, BODY, headers)
        assert (status, answer["error"]["code"]) == (401, "unauthorized")  # type: ignore[index]


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("PUT", "/v1/overrides", b"{not json", 400),
        ("PUT", "/v1/overrides", b"\xff\xfe", 400),
        ("PUT", "/v1/overrides", b"[" * 1000 + b"]" * 1000, 400),
        ("PUT", "/v1/overrides", b'{"domain": NaN}', 400),
        ("PUT", "/v1/overrides", b'{"domain": "a", "domain": "b"}', 400),
        ("PUT", "/v1/overrides", b"1" * 5000, 400),
        ("PUT", "/v1/overrides", {**BODY, "extra": 1}, 400),
        ("PUT", "/v1/overrides", {**BODY, "expires_at": "2020-01-01T00:00:00Z"}, 400),
        ("POST", "/v1/overrides/rollback", {"version": "1"}, 400),
        ("POST", "/v1/overrides/rollback", b"", 400),
        ("POST", "/v1/overrides", BODY, 405),
        ("DELETE", "/v1/overrides", None, 405),
        ("GET", "/v1/overrides/rollback", None, 405),
        ("PUT", "/v1/overrides/history", None, 405),
        ("GET", "/v1/other", None, 404),
        ("GET", "/v1/overrides/a/b", None, 404),
    ],
)
async def test_bad_calls_get_their_code_and_a_json_error(
    admin: Admin, method: str, path: str, body: object, status: int
) -> None:
    got, answer = await admin.call(method, path, body)

    assert got == status
    error = answer["error"]
    assert isinstance(error, dict) and set(error) == {"code", "message"}


async def test_without_a_store_writes_answer_409_with_the_reason(storeless: Admin) -> None:
    status, answer = await storeless.call("PUT", "/v1/overrides", BODY)
    assert status == 409 and "--state-dir" in str(answer["error"])
    assert (await storeless.call("DELETE", "/v1/overrides/ovr_x"))[0] == 409
    assert await storeless.call("GET", "/v1/overrides") == (200, {"version": 0, "overrides": []})

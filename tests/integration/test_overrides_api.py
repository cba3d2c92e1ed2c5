"""The overrides admin API of one real sidecar process (local-only, --state-dir): calls, what the
gRPC answers do, a restart, the CLI, and the security properties (closed port without a token,
401s, the token shown nowhere, fuzzed requests answered 4xx with the process alive)."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from harness.grpc_client import request, rls_stub
from harness.net import consecutive_free_ports, free_port, free_ports
from harness.rules import write_rules
from harness.sidecar import SidecarProcess, start_cli
from ratelimit_sidecar._proto import wire

TOKEN = "adm1n-T0KEN-9f8e7d6c5b4a"
OK, OVER = wire.Code.OK, wire.Code.OVER_LIMIT
RULES = """\
domain: gateway
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 3}
"""
BODY = {
    "domain": "gateway",
    "descriptor": [{"key": "api_key", "value": "pro"}],
    "rate_limit": {"unit": "minute", "requests_per_unit": 6},
    "note": "upgraded",
}
FUZZ_CASES = 240  # bounded: each is one HTTP request


class Node:
    """One sidecar process with its admin address."""

    def __init__(self, tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.admin_port, *ports = free_ports(3)
        args = [
            "--state-dir",
            str(tmp_path / "state"),
            "--admin-address",
            f"127.0.0.1:{self.admin_port}",
        ]
        self.process = SidecarProcess(
            write_rules(tmp_path, RULES), *args, *extra, env=env, ports=(ports[0], ports[1])
        ).wait_ready()
        self.url = f"http://127.0.0.1:{self.admin_port}"

    def call(
        self, method: str, path: str, body: object = None, token: str | None = TOKEN
    ) -> tuple[int, dict[str, object]]:
        data = None if body is None else json.dumps(body).encode()
        message = urllib.request.Request(self.url + path, data=data, method=method)
        if token is not None:
            message.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(message, timeout=5) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def codes(self, value: str, n: int) -> list[int]:
        with grpc.insecure_channel(self.process.address) as channel:
            stub = rls_stub(channel)
            message = request("gateway", [("api_key", value)])
            return [stub.ShouldRateLimit(message, timeout=5).overall_code for _ in range(n)]

    def get(self, path: str) -> str:
        url = f"http://127.0.0.1:{self.process.metrics_port}{path}"
        with urllib.request.urlopen(url, timeout=5) as answer:
            return str(answer.read().decode())

    def stop(self) -> str:
        assert self.process.stop() == 0
        return self.process.stderr


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    running = Node(tmp_path, env={"RLS_ADMIN_TOKEN": TOKEN})
    try:
        yield running
    finally:
        running.process.stop()


def test_crud_history_rollback_and_a_restart_keeps_the_set(tmp_path: Path, node: Node) -> None:
    assert node.codes("pro", 2) == [OK, OK]  # the file's 3 a minute, 2 used
    status, put = node.call("PUT", "/v1/overrides", BODY)
    assert status == 200 and put["version"] == 1
    override_id = str(put["id"])
    assert node.codes("pro", 5) == [OK, OK, OK, OK, OVER]  # 6 a minute, counting on from 2
    assert node.codes("free", 4) == [OK, OK, OK, OVER]  # others keep the file's limit

    raised = {**BODY, "rate_limit": {"unit": "minute", "requests_per_unit": 100}}
    assert node.call("PUT", "/v1/overrides", raised)[1] == {"id": override_id, "version": 2}
    assert node.codes("pro", 1) == [OK]
    assert node.call("POST", "/v1/overrides/rollback", {"version": 1})[1] == {"version": 3}
    assert node.codes("pro", 1) == [OVER]
    _, history = node.call("GET", "/v1/overrides/history")
    changes = history["changes"]
    assert isinstance(changes, list)
    assert [c["action"] for c in changes] == ["rollback", "put", "put"]

    rules = json.loads(node.get("/debug/rules"))
    assert rules["overrides"]["version"] == 3 and len(rules["overrides"]["in_force"]) == 1
    assert "ratelimit_sidecar_overrides_in_force 1.0" in node.get("/metrics")
    node.stop()

    again = Node(tmp_path, env={"RLS_ADMIN_TOKEN": TOKEN})
    try:
        _, listing = again.call("GET", "/v1/overrides")
        assert listing["version"] == 3 and listing["overrides"] == [{"id": override_id, **BODY}]
        assert json.loads(again.get("/debug/rules"))["overrides"]["version"] == 3
        assert again.call("DELETE", f"/v1/overrides/{override_id}")[0] == 200
        assert again.call("GET", f"/v1/overrides/{override_id}")[0] == 404
        assert again.codes("pro", 4) == [OK, OK, OK, OVER]  # the file's limit again
    finally:
        again.process.stop()


def test_the_cli_sets_lists_and_deletes(node: Node) -> None:
    env = {"RLS_ADMIN_TOKEN": TOKEN}
    base = ["overrides", "--admin-url", node.url]
    put = _cli([*base, "set", "--domain", "gateway", "--entry", "api_key=cli",
                "--rate-limit", '{"unit": "hour", "requests_per_unit": 1}'], env)  # fmt: skip
    listed = _cli([*base, "list", "--domain", "gateway"], env)
    unauthorized = _cli([*base, "list"], {"RLS_ADMIN_TOKEN": "wrong"})
    missing = _cli([*base, "get", "ovr_missing"], env)

    assert put.returncode == 0 and json.loads(put.stdout)["version"] == 1
    assert [o["descriptor"] for o in json.loads(listed.stdout)["overrides"]] == [
        [{"key": "api_key", "value": "cli"}]
    ]
    assert node.codes("cli", 2) == [OK, OVER]
    assert (unauthorized.returncode, missing.returncode) == (4, 1)
    deleted = _cli([*base, "delete", json.loads(put.stdout)["id"]], env)
    assert deleted.returncode == 0 and node.codes("cli", 1) == [OK]
    closed = _cli(["overrides", "--admin-url", f"http://127.0.0.1:{free_port()}", "list"], env)
    assert closed.returncode == 3


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    process = start_cli(args, env)
    out, err = process.communicate(timeout=30)
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def test_without_a_token_the_admin_port_stays_closed(tmp_path: Path) -> None:
    node = Node(tmp_path, env={"RLS_ADMIN_TOKEN": ""})
    try:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", node.admin_port), timeout=2).close()
    finally:
        log = node.stop()
    assert "admin API off (no token" in log


def test_the_token_is_checked_and_shown_nowhere(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    node = Node(tmp_path, "--admin-token-file", str(token_file), "--log-level", "debug")
    try:
        for token in (None, "", "wrong", TOKEN[:-1], TOKEN + "x", TOKEN.upper()):
            assert node.call("GET", "/v1/overrides", token=token)[0] == 401
        assert node.call("PUT", "/v1/overrides", BODY, token="wrong")[0] == 401
        oversized = b"PUT /v1/overrides HTTP/1.1\r\nContent-Length: 9999999\r\n\r\n{"
        assert _raw(node.admin_port, oversized) == 401  # refused before any body is read
        assert node.call("PUT", "/v1/overrides", BODY)[0] == 200
        shown = [node.get(p) for p in ("/metrics", "/debug/rules", "/debug/keys", "/readyz")]
        assert 'admin_requests_total{code="401"} 8.0' in shown[0]
        shown += [json.dumps(node.call("GET", "/v1/overrides/history")[1])]
    finally:
        log = node.stop()
    assert "admin API on 127.0.0.1" in log
    for text in (*shown, log):
        assert TOKEN not in text and TOKEN[:12] not in text


def test_fuzzed_requests_get_4xx_and_the_process_stays_alive(node: Node) -> None:
    rng = random.Random(15)
    answers = [(i % 8, _raw(node.admin_port, _fuzzed(rng, i))) for i in range(FUZZ_CASES)]

    # A mangled valid body (kind 5) may still be valid: 200 is a right answer to it.
    wrong = [(kind, status) for kind, status in answers if not 400 <= status < 500]
    assert all(kind == 5 and status == 200 for kind, status in wrong), wrong
    assert {400, 411, 413} <= {status for _, status in answers}
    assert node.process.proc.poll() is None
    assert node.call("PUT", "/v1/overrides", BODY)[0] == 200
    assert node.codes("pro", 1) == [OK]


def _fuzzed(rng: random.Random, index: int) -> bytes:
    """One hostile request: a random JSON value, huge numbers, deep nesting, invalid UTF-8, an
    oversized or lying body, or a broken head."""
    kind = index % 8
    if kind == 0:
        body = json.dumps(_random_json(rng, 4)).encode()
    elif kind == 1:
        digits = b"9" * rng.randint(10, 6000)  # past what Python parses as an int by default
        sign = rng.choice([b"", b"-"])
        body = (
            json.dumps(BODY)
            .encode()
            .replace(b"6}", sign + digits + rng.choice([b"", b".5"]) + b"}")
        )
    elif kind == 2:
        depth = rng.randint(30, 20000)
        body = b'{"domain":' + b"[" * depth + b"]" * depth + b"}"
    elif kind == 3:
        body = b'{"domain": "' + bytes(rng.randrange(128, 256) for _ in range(40)) + b'"}'
    elif kind == 4:
        body = b'{"note": "' + b"x" * (64 * 1024) + b'"}'
    elif kind == 5:
        mangled = bytearray(json.dumps(BODY).encode())
        for _ in range(rng.randint(1, 5)):
            mangled[rng.randrange(len(mangled))] = rng.randrange(256)
        body = bytes(mangled)
    elif kind == 6:
        return (
            b"PUT /v1/overrides HTTP/1.1\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + (b"\r\nContent-Length: 100\r\n\r\n{}")
        )  # a body shorter than announced: the server waits, then gives up
    else:
        return (
            b"PUT /v1/overrides HTTP/1.1\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + (b"\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        )
    head = (
        f"PUT /v1/overrides HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _random_json(rng: random.Random, depth: int) -> object:
    choice = rng.randrange(7 if depth else 4)
    if choice == 0:
        return rng.choice([None, True, False])
    if choice == 1:
        return rng.choice([0, -1, 2**64, 1e308, -0.5, 2**31])
    if choice == 2:
        return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randint(0, 12)))
    if choice == 3:
        return rng.choice(["domain", "descriptor", "rate_limit", "expires_at", "note"])
    if choice == 4:
        return [_random_json(rng, depth - 1) for _ in range(rng.randint(0, 4))]
    keys = ["domain", "descriptor", "rate_limit", "expires_at", "note", "unit", "key", "value"]
    return {rng.choice(keys): _random_json(rng, depth - 1) for _ in range(rng.randint(0, 5))}


def _raw(port: int, message: bytes) -> int:
    """Send raw bytes, return the status code answered."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(message)
        connection.shutdown(socket.SHUT_WR)  # a short body ends here: no waiting for the rest
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def test_workers_have_one_admin_api_and_follow_the_state_file(tmp_path: Path) -> None:
    grpc_port = free_port()
    metrics = consecutive_free_ports(2, avoid=(grpc_port,))  # worker 1 takes metrics + 1
    admin = consecutive_free_ports(1, avoid=(grpc_port, metrics, metrics + 1))
    args = [
        "serve", "--config", str(write_rules(tmp_path, RULES)), "--workers", "2",
        "--grpc-address", f"127.0.0.1:{grpc_port}", "--metrics-address", f"127.0.0.1:{metrics}",
        "--admin-address", f"127.0.0.1:{admin}", "--state-dir", str(tmp_path / "state"),
        "--overrides-refresh-s", "0.2",
    ]  # fmt: skip
    overlapping = [*args[:-6], "--admin-address", f"127.0.0.1:{metrics + 1}", *args[-4:]]
    refused = _cli(overlapping, {"RLS_ADMIN_TOKEN": TOKEN})
    assert refused.returncode == 1 and "workers' metrics ports" in refused.stderr

    parent = start_cli(args, {"RLS_ADMIN_TOKEN": TOKEN})
    try:
        urls = [f"http://127.0.0.1:{metrics + i}/debug/rules" for i in (0, 1)]
        _wait(lambda: all(_version(url) == 0 for url in urls))
        message = urllib.request.Request(
            f"http://127.0.0.1:{admin}/v1/overrides", json.dumps(BODY).encode(), method="PUT"
        )
        message.add_header("Authorization", f"Bearer {TOKEN}")
        with urllib.request.urlopen(message, timeout=5) as answer:
            assert json.loads(answer.read())["version"] == 1
        _wait(lambda: all(_version(url) == 1 for url in urls))
    finally:
        parent.terminate()
        _, err = parent.communicate(timeout=30)
    assert err.count("admin API on") == 1 and "admin API off (--admin-address off)" in err


def _version(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return int(json.loads(answer.read())["overrides"]["version"])
    except OSError:
        return -1


def _wait(condition: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.1)

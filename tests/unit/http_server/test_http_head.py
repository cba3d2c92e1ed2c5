"""The HTTP server's reading of a request head (the admin API's side)."""

from __future__ import annotations

import asyncio
import json

import pytest

from ratelimit_sidecar.http_server.server import HttpApi, Reply, Request, json_reply


async def _answer(head: bytes) -> Reply:
    async def dispatch(request: Request) -> Reply:
        return json_reply({"length": len(request.body)})

    reader = asyncio.StreamReader()
    reader.feed_data(head)
    reader.feed_eof()
    return await HttpApi(dispatch=dispatch, max_body=100)._answer(reader)


@pytest.mark.parametrize("length", [b"\xb2", b"\xb9", b"1\xb3", b"-1", b"1e3", b"", b" "])
async def test_a_content_length_not_in_ascii_digits_is_a_bad_request(length: bytes) -> None:
    """Latin-1 superscripts pass `str.isdigit` but not `int`: 400, not 503."""
    head = b"PUT /v1/overrides HTTP/1.1\r\nContent-Length: " + length + b"\r\n\r\n"

    status, _, body = await _answer(head)

    assert status == 400 and b"Content-Length" in body


async def test_a_valid_content_length_reads_the_body() -> None:
    status, _, body = await _answer(b"PUT / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")

    assert status == 200 and json.loads(body) == {"length": 2}

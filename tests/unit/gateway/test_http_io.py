"""gateway/http_io.read_json on a client that leaves while sending its body: ClientDisconnected (the handlers'
wrapper answers it with a quiet 499), not starlette's own exception, which surfaced as a logged 500."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from gateway.server.client_io import ClientDisconnected, read_json
from gateway.server.errors import ApiError


def request_receiving(*messages: dict) -> Request:
    queue = list(messages)

    async def receive() -> dict:
        return queue.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [(b"content-length", b"40")]}
    return Request(scope, receive)


def test_a_client_that_leaves_mid_body_is_a_disconnect():
    request = request_receiving({"type": "http.request", "body": b'{"model": "m", ', "more_body": True},
                                {"type": "http.disconnect"})
    with pytest.raises(ClientDisconnected):
        asyncio.run(read_json(request, max_bytes=1000))


def test_a_whole_body_is_read_and_limits_still_hold():
    body = {"type": "http.request", "body": b'{"model": "m", "prompt": "hi"}', "more_body": False}
    assert asyncio.run(read_json(request_receiving(body), max_bytes=1000)) == {"model": "m", "prompt": "hi"}
    with pytest.raises(ApiError) as e:
        asyncio.run(read_json(request_receiving(body), max_bytes=10))
    assert e.value.status == 413

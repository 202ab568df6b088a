"""X-Request-Id: a client's (or a router's) id is kept, else one is made; it is echoed in the response
header and carried by every log line written while the request is served.

Routers and proxies (Envoy, SMG, vllm-router) set `x-request-id` so one request can be followed across
hops. An id that is not a short printable token is replaced rather than echoed (no header injection,
no unbounded log lines).
"""

from __future__ import annotations

import contextvars
import logging
import re
import time
import uuid
from collections.abc import Callable

HEADER = b"x-request-id"
_VALID = re.compile(rb"[\x21-\x7e]{1,128}")  # printable ASCII, no spaces, at most 128 bytes

current: contextvars.ContextVar[str | None] = contextvars.ContextVar("mili_request_id", default=None)

log = logging.getLogger("mili.gateway")


def _from_headers(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name == HEADER and _VALID.fullmatch(value):
            return value.decode()
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Pure ASGI (no response buffering, so streams pass through as they are made). API requests get
    one log line when they end, with the id, status and duration, and are counted by status class
    (`on_api_response`); /health and /metrics, which probes and scrapers poll many times a second, are not."""

    def __init__(self, app, on_api_response: Callable[[int], None] | None = None):
        self.app = app
        self.on_api_response = on_api_response

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = _from_headers(scope["headers"])
        token = current.set(request_id)
        status = 0
        started = time.monotonic()

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (HEADER, request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if scope["path"].startswith("/v1/"):
                if self.on_api_response is not None and status:
                    self.on_api_response(status)
                log.info("%s %s -> %d in %.0f ms", scope["method"], scope["path"], status,
                         (time.monotonic() - started) * 1000)
            current.reset(token)


class RequestIdLogFilter(logging.Filter):
    """Adds `request_id` to every record (" request_id=ID" inside a request, "" outside), for the log
    format's `%(request_id)s`."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = current.get()
        record.request_id = f" request_id={request_id}" if request_id else ""
        return True

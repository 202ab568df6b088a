"""Reading request bodies within a size limit, writing stream lines, and noticing a client that went away."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect, Request

from gateway.server.errors import ApiError, invalid
from shared.request_limits import is_decimal

T = TypeVar("T")


# Characters JSON leaves raw inside strings but Python's str.splitlines ends a line at, and so httpx's iter_lines,
# which the ollama client and httpx-sse read streams with (NEL, LINE and PARAGRAPH SEPARATOR; the control
# characters it also splits at are escaped by JSON itself): escaped, a stream's event stays one line for them too.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def one_line_json(obj: Any) -> str:
    """obj as JSON text on one line for any line splitter: UTF-8 as it is, line-breaking characters escaped."""
    return json.dumps(obj, ensure_ascii=False).translate(_LINE_BREAKS)


class ClientDisconnected(Exception):
    pass


async def read_json(request: Request, max_bytes: int) -> Any:
    """The body as JSON; 413 past max_bytes (checked on the header first, then while reading), 400 if not JSON,
    ClientDisconnected if the client leaves before the body is complete."""
    declared = request.headers.get("content-length")
    too_large = ApiError(413, f"the request body exceeds the limit of {max_bytes} bytes")
    if declared is not None and is_decimal(declared) and int(declared) > max_bytes:
        raise too_large
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:  # it left before its whole body came: no one to answer
        raise ClientDisconnected() from None
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid(f"the request body is not valid JSON: {e}") from None


# What a route that may be handed its body takes by default: not read yet (a route that dispatches on the body reads
# it first and passes it on, JSON null included).
UNREAD: Any = object()


async def body_json(request: Request, max_bytes: int, raw: Any = UNREAD) -> Any:
    """`raw`, the body a caller read already, else the body read here (read_json)."""
    return await read_json(request, max_bytes) if raw is UNREAD else raw


async def _wait_disconnect(request: Request) -> None:
    # Once the body has been read, the server's receive() returns only when the client disconnects.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect_unless_disconnected(request: Request, events: AsyncIterator[T]) -> list[T]:
    """Drain `events`, but cancel it (so its cleanup runs) as soon as the client disconnects."""
    items: list[T] = []

    async def consume() -> None:
        async for item in events:
            items.append(item)

    consumer = asyncio.create_task(consume())
    watcher = asyncio.create_task(_wait_disconnect(request))
    try:
        await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not consumer.done():
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            raise ClientDisconnected()
    consumer.result()  # re-raises the request's error, if any
    return items

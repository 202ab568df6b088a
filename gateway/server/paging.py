"""The `limit` query parameter of the routes that list in pages (Anthropic's model list, the Responses API's
input items): an integer from 1 to the route's maximum, else a 400 naming it."""

from __future__ import annotations

from gateway.server.errors import invalid


def page_limit(raw: str | None, default: int, maximum: int) -> int:
    try:
        limit = default if raw is None else int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= maximum:
        raise invalid(f"limit must be an integer from 1 to {maximum}, got {raw!r}", "limit")
    return limit

"""End-to-end request deadlines: `X-Request-Timeout: SECONDS` (or the server's --request-timeout) bounds a
request from its arrival, queue included.

The gateway keeps the deadline on its own monotonic clock and sends the worker the seconds left (clocks
differ across processes). Whichever notices first ends the request: the worker drops it at its next
step (queued ones without computing them), the gateway at the deadline itself. The client gets a 504
error object with code `deadline_exceeded`, or, when the stream had begun, an error event with that
code as the stream's last event.
"""

from __future__ import annotations

import math
import time

from starlette.requests import Request

from gateway.server.errors import ApiError, invalid

HEADER = "X-Request-Timeout"
MAX_TIMEOUT_S = 7 * 24 * 3600.0


class DeadlineExceeded:
    """Put into a request's queue by the gateway's timer when its deadline passes."""


def parse_timeout(value: str | None, default_s: float | None) -> float | None:
    """Seconds the request may take: the header's value, else the server default (None: no deadline)."""
    if value is None:
        return default_s
    try:
        seconds = float(value.strip())
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_TIMEOUT_S:
        raise invalid(f"{HEADER} must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:.0f}, "
                      f"got {value!r}", HEADER)
    return seconds


def request_deadline(request: Request, default_s: float | None) -> float | None:
    """The request's deadline on the gateway's time.monotonic() clock, counted from now (its arrival)."""
    timeout = parse_timeout(request.headers.get(HEADER), default_s)
    return None if timeout is None else time.monotonic() + timeout


def exceeded() -> ApiError:
    return ApiError(504, "the request did not finish within its deadline (X-Request-Timeout or the server's "
                         "--request-timeout)", code="deadline_exceeded")


def check_not_passed(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise exceeded()

"""The HTTP side of resumable streams: SSE responses that read a stream's buffer (gateway/streams/resume_buffer.py),
with `id: N` on every event and the `X-Stream-Id` header, and `GET /v1/streams/{stream_id}`, which resumes
one after its `Last-Event-ID`."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from gateway.server.auth import credentials
from gateway.server.errors import ApiError, invalid
from gateway.streams.resume_buffer import NamedEvent, Payload, Reader, StreamRegistry

STREAM_ID_HEADER = "X-Stream-Id"
LAST_EVENT_ID = "Last-Event-ID"
MAX_EVENT_ID_DIGITS = 18  # ids are counted from 0; more digits than this is no id a stream can reach
_EVENT_ID = re.compile(rf"\s*(\d{{1,{MAX_EVENT_ID_DIGITS}}})\s*")


def start_response(registry: StreamRegistry, payloads: AsyncIterator[Payload], abort, request: Request,
                   ping_s: float) -> EventSourceResponse:
    """A new stream: its generation runs on in a task of its own; this response is its first reader."""
    reader = registry.start(payloads, abort, credentials(request))
    return _response(reader, ping_s)


async def resume_stream(request: Request) -> Response:
    state = request.app.state.mili
    last = _last_event_id(request.headers.get(LAST_EVENT_ID))
    stream_id = request.path_params["stream_id"]
    registry: StreamRegistry | None = state.streams
    # Another API key's stream is as unknown as a made-up id: ids cannot be probed.
    stream = registry.find(stream_id, credentials(request)) if registry else None
    if stream is None:
        raise ApiError(404, "no such stream: the id is unknown, has expired (--stream-resume-ttl), or belongs to "
                            "another API key", param="stream_id", code="stream_not_found")
    first = 0 if last is None else last + 1
    if first > stream.next_id:
        raise invalid(f"{LAST_EVENT_ID} {last} is beyond the stream's last event so far "
                      f"({stream.next_id - 1})", LAST_EVENT_ID)
    if request.method == "HEAD":  # a probe: it must not take the stream over from its reader
        return Response(headers={STREAM_ID_HEADER: stream.id, "Content-Type": "text/event-stream"})
    state.metrics.stream_resumes.labels(state.metrics.model).inc()
    return _response(registry.attach(stream, first), state.settings.sse_ping_s)


def _last_event_id(value: str | None) -> int | None:
    if value is None:
        return None
    match = _EVENT_ID.fullmatch(value)
    if match is None:
        raise invalid(f"{LAST_EVENT_ID} must be the id (a non-negative integer) of the last event received, "
                      f"got {value[:40]!r}", LAST_EVENT_ID)
    return int(match.group(1))


class _Ping(ServerSentEvent):
    """A keep-alive comment line with no blank line after it. A blank line ends an event, and clients that
    keep the last event id (the openai SDK's decoder, as the SSE spec's "last event ID buffer" is never
    reset) dispatch an event with empty data at a blank line once an id was seen, which they then fail to
    parse as JSON; a lone comment line dispatches nothing."""

    def encode(self) -> bytes:
        return b": ping\n"


def _response(reader: Reader, ping_s: float) -> EventSourceResponse:
    async def events() -> AsyncIterator[ServerSentEvent]:
        async for event_id, payload in reader.events():
            if isinstance(payload, NamedEvent):
                yield ServerSentEvent(data=payload.data, event=payload.event, id=str(event_id), sep="\n")
            else:
                yield ServerSentEvent(data=payload, id=str(event_id), sep="\n")

    # The background task detaches a reader whose client left before the response's first event (a
    # generator never started has no cleanup to run); it runs once the response ends, however it ends.
    return EventSourceResponse(events(), ping=ping_s, sep="\n", ping_message_factory=_Ping,
                               headers={STREAM_ID_HEADER: reader.stream.id}, background=BackgroundTask(reader.detach))

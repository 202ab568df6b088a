"""POST /v1/responses: OpenAI's Responses API, streaming and not, served as the chat request it translates into
(gateway/responses_api/to_chat.py) and answered with output items (gateway/responses_api/output.py).

A stream is a sequence of typed events, each sent with its type as the SSE event name and ending with
response.completed (or .incomplete); a failure once streaming (a deadline, a lost worker) sends an `error`
event and response.failed. With `--stream-resume-ttl` a stream is resumable as the other endpoints' are
(`GET /v1/streams/{id}`, the events replayed with their names).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.openai.routes import Admitted, admit_chat, collect, sse_response
from gateway.responses_api.output import ResponseBuilder
from gateway.responses_api.to_chat import parse_responses, responses_names
from gateway.server.client_io import read_json
from gateway.server.deadlines import request_deadline
from gateway.server.errors import ApiError
from gateway.streams.resume_buffer import NamedEvent

log = logging.getLogger("mili.gateway")


async def responses(request: Request) -> Response:
    state = request.app.state.mili
    deadline = request_deadline(request, state.settings.request_timeout)
    req = parse_responses(await read_json(request, state.settings.max_body_bytes), state.settings.limits)
    with responses_names():  # the checks that need the model: context length, the schema's grammar
        admitted, _ = await admit_chat(request, req.chat, deadline)
    builder = ResponseBuilder(req, state.text.tokenizer, state.token_names)
    if req.chat.stream:
        return sse_response(request, _stream(builder, admitted), admitted, named=True)
    finish_reason = None
    for e in await collect(request, admitted):
        builder.feed(e)
        finish_reason = e.finish_reason or finish_reason
    return JSONResponse(builder.finish(finish_reason, admitted.usage)[-1]["response"])


async def _stream(builder: ResponseBuilder, admitted: Admitted) -> AsyncIterator[NamedEvent]:
    for event in builder.start():
        yield _sse(event)
    finish_reason = None
    try:
        async for e in admitted.events():
            finish_reason = e.finish_reason or finish_reason
            for event in builder.feed(e):
                yield _sse(event)
    except ApiError as e:
        log.warning("stream ended with an error: %s", e.message)
        for event in builder.fail(e.code, e.message, e.param, admitted.usage):
            yield _sse(event)
        return
    for event in builder.finish(finish_reason, admitted.usage):
        yield _sse(event)


def _sse(event: dict[str, Any]) -> NamedEvent:
    return NamedEvent(event["type"], json.dumps(event, ensure_ascii=False))

"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API, served as the chat request it
translates into (gateway/anthropic/to_chat.py) and answered with content blocks (gateway/anthropic/output.py).

The headers Anthropic's clients send (`anthropic-version`, `anthropic-beta`, whatever their values) are accepted
and change nothing; `x-api-key` is a key as `Authorization: Bearer` is (gateway/server/auth.py). Errors are
Anthropic error objects (gateway/server/errors.py picks the shape by path); once a stream has started, a
failure is an `error` event and the stream ends. While the model is silent, `ping` events keep the stream alive.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.anthropic.output import MessageBuilder
from gateway.anthropic.to_chat import anthropic_names, parse_messages
from gateway.openai.parse import require_model
from gateway.openai.routes import Admitted, admit_chat, collect, sse_response
from gateway.server.client_io import one_line_json, read_json
from gateway.server.deadlines import request_deadline
from gateway.server.errors import ApiError
from gateway.server.task_guard import require_task
from gateway.streams.resume_buffer import NamedEvent

log = logging.getLogger("mili.gateway")
_PING = NamedEvent("ping", json.dumps({"type": "ping"}))


async def messages(request: Request) -> Response:
    state = request.app.state.mili
    require_task(state.engine_config.task, "generate")
    deadline = request_deadline(request, state.settings.request_timeout)
    req = parse_messages(await read_json(request, state.settings.max_body_bytes), state.settings.limits)
    with anthropic_names(req.body):  # the checks that need the model: context length, the tools' grammar
        admitted, _ = await admit_chat(request, req.chat, deadline)
    builder = MessageBuilder(req.body.model)
    if req.chat.stream:
        return sse_response(request, _stream(builder, admitted), admitted, named=True, ping=_PING)
    finish_reason = stop_string = None
    for e in await collect(request, admitted):
        builder.feed(e)
        finish_reason = e.finish_reason or finish_reason
        stop_string = e.stop_string or stop_string
    return JSONResponse(builder.message(finish_reason, stop_string, admitted.usage))


async def count_tokens(request: Request) -> Response:
    """The prompt's tokens as /v1/messages renders the same request: what that request's usage reports as
    input_tokens plus cache_read_input_tokens (input_tokens alone when no prefix of it was cached)."""
    state = request.app.state.mili
    require_task(state.engine_config.task, "generate")
    req = parse_messages(await read_json(request, state.settings.max_body_bytes), state.settings.limits,
                         count_only=True)
    require_model(req.chat.model, state.settings.served_model_names)
    with anthropic_names(req.body):
        _, prompt = state.text.render_chat(list(req.chat.messages), req.chat.template_kwargs, req.chat.tools,
                                           req.chat.add_generation_prompt, req.chat.continue_final_message)
    return JSONResponse({"input_tokens": len(prompt)})


async def _stream(builder: MessageBuilder, admitted: Admitted) -> AsyncIterator[NamedEvent]:
    yield _sse(builder.start(admitted.usage))
    finish_reason = stop_string = None
    try:
        async for e in admitted.events():
            finish_reason = e.finish_reason or finish_reason
            stop_string = e.stop_string or stop_string
            for event in builder.feed(e):
                yield _sse(event)
    except ApiError as e:
        log.warning("stream ended with an error: %s", e.message)
        yield _sse(e.anthropic_body())
        return
    for event in builder.finish(finish_reason, stop_string, admitted.usage):
        yield _sse(event)


def _sse(event: dict[str, Any]) -> NamedEvent:
    return NamedEvent(event["type"], one_line_json(event))

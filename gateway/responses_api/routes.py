"""POST /v1/responses: OpenAI's Responses API, streaming and not, served as the chat request it translates into
(gateway/responses_api/to_chat.py) and answered with output items (gateway/responses_api/output.py). A response
made with `store` (default true) is kept (gateway/responses_api/store.py): GET /v1/responses/{id} returns it, GET
/v1/responses/{id}/input_items lists what it was made from, DELETE /v1/responses/{id} drops it, and a request
naming it as `previous_response_id` continues its conversation. POST /v1/responses/input_tokens counts a request's
prompt tokens without running it.

A stream is a sequence of typed events, each sent with its type as the SSE event name and ending with
response.completed (or .incomplete); a failure once streaming (a deadline, a lost worker) sends an `error`
event and response.failed. With `--stream-resume-ttl` a stream is resumable as the other endpoints' are
(`GET /v1/streams/{id}`, the events replayed with their names).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.openai.parse import require_model
from gateway.openai.routes import Admitted, admit_chat, collect, sse_response
from gateway.openai.validation import validate
from gateway.responses_api.output import ResponseBuilder
from gateway.responses_api.schema import PROMPT_FIELDS, UNSUPPORTED, InputTokensBody, item_kind
from gateway.responses_api.store import ResponseStore, StoredResponse
from gateway.responses_api.to_chat import ResponsesRequest, parse_responses, responses_names
from gateway.server.auth import credentials
from gateway.server.client_io import one_line_json, read_json
from gateway.server.deadlines import request_deadline
from gateway.server.errors import ApiError, invalid
from gateway.server.paging import page_limit
from gateway.server.task_guard import require_task
from gateway.streams.resume_buffer import NamedEvent

log = logging.getLogger("mili.gateway")


async def responses(request: Request) -> Response:
    state = request.app.state.mili
    deadline = request_deadline(request, state.settings.request_timeout)
    raw = await read_json(request, state.settings.max_body_bytes)
    store: ResponseStore | None = state.responses
    req = parse_responses(raw, state.settings.limits, _earlier(raw, store, credentials(request)), store is not None)
    with responses_names():  # the checks that need the model: context length, the schema's grammar
        admitted, _ = await admit_chat(request, req.chat, deadline)
    builder = ResponseBuilder(req, state.text.tokenizer, state.token_names)
    kept = functools.partial(_keep, store, credentials(request), req) if req.store else None
    if req.chat.stream:
        return sse_response(request, _stream(builder, admitted, kept), admitted, named=True)
    finish_reason = None
    for e in await collect(request, admitted):
        builder.feed(e)
        finish_reason = e.finish_reason or finish_reason
    response = builder.finish(finish_reason, admitted.usage)[-1]["response"]
    if kept is not None:
        kept(response)
    return JSONResponse(response)


async def stored_response(request: Request) -> Response:
    """GET: the stored response object; DELETE: drops it."""
    stored = _stored(request)
    if request.method == "DELETE":
        request.app.state.mili.responses.delete(stored.response["id"], credentials(request))
        return JSONResponse({"id": stored.response["id"], "object": "response", "deleted": True})
    return JSONResponse(stored.response)


async def response_input_items(request: Request) -> Response:
    """The items a stored response was made from (the earlier turns', then its input), newest first unless
    order=asc, `limit` (1-100, default 20) at a time after the item `after`, as OpenAI pages them."""
    items = list(_stored(request).input_items)
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid(f"order must be asc or desc, got {order!r}", "order")
    limit = page_limit(query.get("limit"), 20, 100)
    if order == "desc":
        items.reverse()
    after = query.get("after")
    if after is not None:
        at = next((i for i, item in enumerate(items) if item["id"] == after), None)
        if at is None:
            raise ApiError(404, f"after: the response has no item {after!r}", "after", "item_not_found")
        items = items[at + 1:]
    page = items[:limit]
    return JSONResponse({"object": "list", "data": page, "has_more": len(items) > limit,
                         "first_id": page[0]["id"] if page else None, "last_id": page[-1]["id"] if page else None})


async def input_tokens(request: Request) -> Response:
    """POST /v1/responses/input_tokens: the prompt's tokens as /v1/responses renders the same request (what that
    request's usage reports as input_tokens). GET and DELETE on the path are the stored-response route's (a 404)."""
    state = request.app.state.mili
    require_task(state.engine_config.task, "generate")
    raw = await read_json(request, state.settings.max_body_bytes)
    body = validate(InputTokensBody, raw, UNSUPPORTED, tagged={"input": item_kind})
    served = state.settings.served_model_names
    require_model(body.model or served[0], served)
    prompt_only = {name: raw[name] for name in PROMPT_FIELDS if name in raw}
    req = parse_responses({**prompt_only, "model": served[0]}, state.settings.limits,
                          _earlier(raw, state.responses, credentials(request)))
    with responses_names():
        _, prompt = state.text.render_chat(list(req.chat.messages), req.chat.template_kwargs, req.chat.tools,
                                           req.chat.add_generation_prompt, req.chat.continue_final_message)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": len(prompt)})


def _earlier(raw: Any, store: ResponseStore | None, owner: str) -> list[dict[str, Any]]:
    """The conversation a request's `previous_response_id` continues ([] without one; a mistyped one is left to the
    body's validation)."""
    previous = raw.get("previous_response_id") if isinstance(raw, dict) else None
    if not isinstance(previous, str):
        return []
    if store is None:
        raise invalid("previous_response_id needs stored responses, and this server keeps none "
                      "(--responses-store-buffer 0): send the whole conversation as input", "previous_response_id")
    stored = store.get(previous, owner)
    if stored is None:
        raise ApiError(404, f"Previous response with id {previous!r} not found.", "previous_response_id",
                       "previous_response_not_found")
    return stored.conversation()


def _stored(request: Request) -> StoredResponse:
    store: ResponseStore | None = request.app.state.mili.responses
    response_id = request.path_params["response_id"]
    stored = store.get(response_id, credentials(request)) if store is not None else None
    if stored is None:
        raise ApiError(404, f"Response with id {response_id!r} not found.", None, "response_not_found")
    return stored


def _keep(store: ResponseStore, owner: str, req: ResponsesRequest, response: dict[str, Any]) -> None:
    if response["status"] in ("completed", "incomplete"):
        store.put(owner, response, req.input_items)


async def _stream(builder: ResponseBuilder, admitted: Admitted,
                  kept: Callable[[dict[str, Any]], None] | None) -> AsyncIterator[NamedEvent]:
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
    events = builder.finish(finish_reason, admitted.usage)
    if kept is not None:
        kept(events[-1]["response"])
    for event in events:
        yield _sse(event)


def _sse(event: dict[str, Any]) -> NamedEvent:
    return NamedEvent(event["type"], one_line_json(event))

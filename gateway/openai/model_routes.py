"""GET /v1/models and GET /v1/models/{model}: the served model's card, in one shape that both OpenAI's and Anthropic's
SDKs read.

OpenAI's clients read `object: "list"` and each card's `id`, `object`, `created` and `owned_by`; Anthropic's read
`data`, `has_more`, `first_id` and `last_id`, and each card's `id`, `type: "model"`, `display_name`, `created_at`
(RFC 3339) and `max_input_tokens` / `max_tokens`. A card carries both sets of fields, so `client.models.list()` and
`client.models.retrieve(name)` work from either SDK (and from Claude Code's model discovery). Anthropic's list takes
`limit`, `after_id` and `before_id`. Every served name (`--served-model-name A B ...`) has a card, in that order, as
vLLM lists them; a cursor at one gives the page after or before it. Errors come in
the shape of the caller's API (gateway/server/errors.py).
"""

from __future__ import annotations

import datetime

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.openai.parse import require_model, without_default_tag
from gateway.server.paging import page_limit

MAX_LIST_LIMIT = 1000  # Anthropic's bound on `limit`


def model_card(request: Request, name: str) -> dict:
    """One served name's card (every name of the model has one, as vLLM lists them)."""
    state = request.app.state.mili
    info = state.pool.info
    card = {"id": name, "object": "model", "created": state.started, "owned_by": "mili",
            "root": state.engine_config.model, "task": state.engine_config.task,
            "type": "model", "display_name": name, "lifecycle": "active",
            "created_at": datetime.datetime.fromtimestamp(state.started, datetime.UTC).isoformat().replace("+00:00",
                                                                                                          "Z")}
    if info is not None:  # known once a worker has loaded the model
        card["max_model_len"] = card["max_input_tokens"] = card["max_tokens"] = info.max_model_len
    return card


async def list_models(request: Request) -> Response:
    limit = page_limit(request.query_params.get("limit"), MAX_LIST_LIMIT, MAX_LIST_LIMIT)
    names = list(request.app.state.mili.settings.served_model_names)
    after, before = request.query_params.get("after_id"), request.query_params.get("before_id")
    if before in names:  # Anthropic's cursors: the page just before one id, or just after one
        earlier = names[:names.index(before)]
        page, has_more = earlier[-limit:], len(earlier) > limit
    else:
        later = names[names.index(after) + 1:] if after in names else names
        page, has_more = later[:limit], len(later) > limit
    data = [model_card(request, name) for name in page]
    return JSONResponse({"object": "list", "data": data, "has_more": has_more,
                         "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None})


async def retrieve_model(request: Request) -> Response:
    state = request.app.state.mili
    served = state.settings.served_model_names
    name = without_default_tag(request.path_params["model"], served)
    require_model(name, served)
    return JSONResponse(model_card(request, name))

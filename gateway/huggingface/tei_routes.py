"""text-embeddings-inference's (TEI's) own API, for the clients written against it (huggingface_hub's
InferenceClient.feature_extraction, Haystack's and LangChain's TEI classes): POST /embed (--task embed) and, on
POST /rerank and /v1/rerank beside Jina's and Cohere's shape, TEI's (`texts` rather than `documents`; --task score).
POST / runs /embed on an embedding server and the rerank on a scoring one, as TEI's POST / runs its model's route.

The vectors and scores are the ones /v1/embeddings and /v1/rerank give for the same texts. Errors are TEI's
`{"error", "error_type"}`: 400 "Empty" for no input, 422 "Validation" for a request it cannot take.
"""

from __future__ import annotations

import math
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.huggingface.errors import TEI, answered_in
from gateway.huggingface.tei_schema import SimilarityParameters, TeiEmbedBody, TeiRerankBody, TeiSimilarityBody
from gateway.openai.validation import validate
from gateway.pooling import routes as pooling
from gateway.pooling.output import unit_length
from gateway.pooling.run import pool_prompts
from gateway.server.client_io import UNREAD, body_json, read_json
from gateway.server.deadlines import request_deadline
from gateway.server.errors import ApiError
from gateway.server.task_guard import require_task


async def embed(request: Request, raw: Any = UNREAD) -> Response:
    state = request.app.state.mili
    require_task(state.engine_config.task, "embed")
    body = validate(TeiEmbedBody, await _raw(request, raw), ())
    inputs = body.inputs if _is_batch(body.inputs) else [body.inputs]
    if not inputs or any(len(item) == 0 for item in inputs):
        raise _empty("inputs")
    pooling.check_dimensions(state, body.dimensions)
    prompts = pooling.prompt_builder(state).embedding_inputs(inputs, body.context_cut(), True,
                                                             keep_end=body.keeps_end())
    vectors = await pool_prompts(request, prompts, request_deadline(request, state.settings.request_timeout))
    return JSONResponse([_shaped(v, body.dimensions, body.normalize) for v in vectors])


async def similarity(request: Request, raw: Any = UNREAD) -> Response:
    """The cosine of the source sentence's embedding with each sentence's, in the sentences' order."""
    state = request.app.state.mili
    require_task(state.engine_config.task, "embed")
    body = validate(TeiSimilarityBody, await _raw(request, raw), ())
    texts = [body.inputs.source_sentence, *body.inputs.sentences]
    if not body.inputs.sentences or not all(texts):
        raise _empty("inputs.sentences" if not body.inputs.sentences else "inputs")
    options = body.parameters or SimilarityParameters()
    prompts = pooling.prompt_builder(state).embedding_inputs(texts, options.context_cut(), True,
                                                             keep_end=options.keeps_end())
    source, *others = [unit_length(v) for v in await pool_prompts(
        request, prompts, request_deadline(request, state.settings.request_timeout))]
    return JSONResponse([math.fsum(a * b for a, b in zip(source, other)) for other in others])


async def rerank(request: Request, raw: Any = UNREAD) -> Response:
    state = request.app.state.mili
    require_task(state.engine_config.task, "score")
    body = validate(TeiRerankBody, await _raw(request, raw), ())
    if not body.texts or not all(body.texts):
        raise _empty("texts")
    prompts = pooling.prompt_builder(state).pairs([body.query] * len(body.texts), body.texts, body.context_cut(),
                                                  None)
    scores = [v[0] for v in await pool_prompts(request, prompts,
                                               request_deadline(request, state.settings.request_timeout))]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])  # highest first; ties in the texts' order
    return JSONResponse([{"index": i, "score": scores[i], **({"text": body.texts[i]} if body.return_text else {})}
                         for i in order])


async def rerank_either(request: Request) -> Response:
    """POST /rerank and /v1/rerank: TEI's dialect when the body names `texts` and no `documents`, else Jina's and
    Cohere's v1 (gateway/pooling/routes.py), each answering its errors in its own shape."""
    state = request.app.state.mili
    raw = await read_json(request, state.settings.max_body_bytes)
    if isinstance(raw, dict) and "texts" in raw and "documents" not in raw:
        return await answered_in(lambda _: TEI, lambda r: rerank(r, raw))(request)
    return await pooling.rerank(request, raw)


async def _raw(request: Request, raw: Any) -> Any:
    return await body_json(request, request.app.state.mili.settings.max_body_bytes, raw)


def _is_batch(inputs: Any) -> bool:
    """A list of texts or of token-id lists (a list of ints is one input's token ids)."""
    return isinstance(inputs, list) and any(not isinstance(item, int) for item in inputs)


def _empty(field: str) -> ApiError:
    return ApiError(400, f"Input validation error: `{field}` cannot be empty", field, code="empty")


def _shaped(vector: list[float], dimensions: int | None, normalize: bool) -> list[float]:
    """TEI's order: the first `dimensions` values, then (normalize) unit length."""
    head = vector[:dimensions] if dimensions is not None else vector
    return unit_length(head) if normalize else head

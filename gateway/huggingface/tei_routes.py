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
from gateway.openai.routes import ready_info
from gateway.openai.validation import validate
from gateway.pooling import routes as pooling
from gateway.pooling.prompts import PromptBuilder
from gateway.pooling.run import pool_prompts
from gateway.server.client_io import read_json
from gateway.server.deadlines import request_deadline
from gateway.server.errors import ApiError, invalid
from gateway.server.task_guard import require_task


async def embed(request: Request, raw: Any = None) -> Response:
    state = request.app.state.mili
    require_task(state.engine_config.task, "embed")
    body = validate(TeiEmbedBody, await _raw(request, raw), ())
    inputs = body.inputs if _is_batch(body.inputs) else [body.inputs]
    if not inputs or any(len(item) == 0 for item in inputs):
        raise _empty("inputs")
    size = state.pooling.dimensions
    if body.dimensions is not None and size and body.dimensions > size:
        raise invalid(f"`dimensions` ({body.dimensions}) is larger than this model's embedding size ({size})",
                      "dimensions")
    prompts = _prompts(state).embedding_inputs(inputs, -1 if body.truncate is not False else None, True,
                                               keep_end=body.truncation_direction.lower() == "left")
    vectors = await pool_prompts(request, prompts, request_deadline(request, state.settings.request_timeout))
    return JSONResponse([_shaped(v, body.dimensions, body.normalize) for v in vectors])


async def similarity(request: Request, raw: Any = None) -> Response:
    """The cosine of the source sentence's embedding with each sentence's, in the sentences' order."""
    state = request.app.state.mili
    require_task(state.engine_config.task, "embed")
    body = validate(TeiSimilarityBody, await _raw(request, raw), ())
    texts = [body.inputs.source_sentence, *body.inputs.sentences]
    if not body.inputs.sentences or not all(texts):
        raise _empty("inputs.sentences" if not body.inputs.sentences else "inputs")
    options = body.parameters or SimilarityParameters()
    prompts = _prompts(state).embedding_inputs(texts, -1 if options.truncate is not False else None, True,
                                               keep_end=options.truncation_direction.lower() == "left")
    source, *others = [_unit(v) for v in await pool_prompts(
        request, prompts, request_deadline(request, state.settings.request_timeout))]
    return JSONResponse([math.fsum(a * b for a, b in zip(source, other)) for other in others])


async def rerank(request: Request, raw: Any = None) -> Response:
    state = request.app.state.mili
    require_task(state.engine_config.task, "score")
    body = validate(TeiRerankBody, await _raw(request, raw), ())
    if not body.texts or not all(body.texts):
        raise _empty("texts")
    prompts = _prompts(state).pairs([body.query] * len(body.texts), body.texts,
                                    -1 if body.truncate is not False else None, None)
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
    return raw if raw is not None else await read_json(request, request.app.state.mili.settings.max_body_bytes)


def _is_batch(inputs: Any) -> bool:
    """A list of texts or of token-id lists (a list of ints is one input's token ids)."""
    return isinstance(inputs, list) and any(not isinstance(item, int) for item in inputs)


def _empty(field: str) -> ApiError:
    return ApiError(400, f"Input validation error: `{field}` cannot be empty", field, code="empty")


def _prompts(state) -> PromptBuilder:
    info = ready_info(state)
    return PromptBuilder(state.text.tokenizer, state.pooling, info.vocab_size, info.max_model_len)


def _shaped(vector: list[float], dimensions: int | None, normalize: bool) -> list[float]:
    """TEI's order: the first `dimensions` values, then (normalize) unit length."""
    head = vector[:dimensions] if dimensions is not None else vector
    return _unit(head) if normalize else head


def _unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(math.fsum(v * v for v in vector))
    return [v / norm for v in vector] if norm > 0 else vector

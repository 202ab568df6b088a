"""POST /v1/embeddings, Ollama's /api/embed and /api/embeddings and llama.cpp's /embedding (--task embed), POST
/v1/rerank, /rerank, /v2/rerank (Cohere's) and /score (--task score).

Every check runs before anything is submitted: the task, the body, the model, each input against the vocabulary
and the context. Then each input (or query-document pair) is one prefill-only request in the workers' batches.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.openai.parse import check_priority, require_model, without_default_tag
from gateway.openai.routes import ready_info
from gateway.openai.validation import validate
from gateway.pooling.output import (cohere_rerank_body, embeddings_body, encode_embedding, llama_embeddings_body,
                                    llama_normalized, matryoshka, rerank_body, score_body)
from gateway.pooling.prompts import PromptBuilder, llama_inputs
from gateway.pooling.run import pool_prompts
from gateway.pooling.schema import (SCORE_SIDES, UNSUPPORTED, CohereRerankRequest, EmbeddingRequest,
                                    LlamaEmbeddingBody, OllamaEmbeddingsRequest, OllamaEmbedRequest, RerankRequest,
                                    ScoreRequest)
from gateway.server.client_io import UNREAD, body_json
from gateway.server.deadlines import request_deadline
from gateway.server.errors import ApiError, invalid
from gateway.server.task_guard import require_task


async def _body(request: Request, task: str, model_cls, default_tag: bool = False, raw: Any = UNREAD):
    """The checked body: the task, its shape, the model (with `default_tag`, Ollama's `name:latest` names it too).
    `raw`: the body as read already (by a route that looked at it first), else it is read here."""
    state = request.app.state.mili
    require_task(state.engine_config.task, task)
    raw = await body_json(request, state.settings.max_body_bytes, raw)
    req = validate(model_cls, raw, unsupported=UNSUPPORTED)
    check_priority(getattr(req, "priority", None), state.settings.limits)
    served = state.settings.served_model_names
    model = getattr(req, "model", None)  # llama.cpp's bodies name none
    if model is not None:
        require_model(without_default_tag(model, served) if default_tag else model, served)
    if state.draining:
        raise ApiError(503, "the server is shutting down", code="draining")
    return state, req


def _answered_name(state, req) -> str:
    """The model name an answer carries: the one the request asked for (any served name), else the first."""
    return req.model or state.settings.served_model_name


def prompt_builder(state) -> PromptBuilder:
    info = ready_info(state)
    return PromptBuilder(state.text.tokenizer, state.pooling, info.vocab_size, info.max_model_len)


async def embeddings(request: Request) -> Response:
    state, req = await _body(request, "embed", EmbeddingRequest)
    deadline = request_deadline(request, state.settings.request_timeout)
    check_dimensions(state, req.dimensions)
    single = isinstance(req.input, str) or isinstance(req.input[0], int)
    inputs = [req.input] if single else req.input
    prompts = prompt_builder(state).embedding_inputs(inputs, req.truncate_prompt_tokens, req.add_special_tokens)
    vectors = await pool_prompts(request, prompts, deadline, req.priority)
    data = [encode_embedding(matryoshka(v, req.dimensions), req.encoding_format) for v in vectors]
    return JSONResponse(embeddings_body(_answered_name(state, req), data, sum(map(len, prompts))))


async def ollama_embed(request: Request) -> Response:
    """Ollama's POST /api/embed: the vectors /v1/embeddings gives for the same texts (the model's own pooling and
    normalization). `truncate` (default true) cuts inputs at the context length; false refuses them."""
    state, req = await _body(request, "embed", OllamaEmbedRequest, default_tag=True)
    check_dimensions(state, req.dimensions)
    started = time.monotonic_ns()
    inputs = [req.input] if isinstance(req.input, str) else req.input
    prompts, vectors = [], []
    if inputs:  # Ollama answers an empty list with no vectors
        prompts = prompt_builder(state).embedding_inputs(inputs, -1 if req.truncate else None, True)
        vectors = await pool_prompts(request, prompts, request_deadline(request, state.settings.request_timeout))
    return JSONResponse({"model": req.model, "embeddings": [matryoshka(v, req.dimensions) for v in vectors],
                         "total_duration": time.monotonic_ns() - started, "load_duration": 0,
                         "prompt_eval_count": sum(map(len, prompts))})


async def ollama_embeddings(request: Request) -> Response:
    """Ollama's older POST /api/embeddings: {"embedding": one vector}."""
    state, req = await _body(request, "embed", OllamaEmbeddingsRequest, default_tag=True)
    prompts = prompt_builder(state).embedding_inputs([req.prompt], -1, True)
    [vector] = await pool_prompts(request, prompts, request_deadline(request, state.settings.request_timeout))
    return JSONResponse({"embedding": vector})


async def llama_embedding(request: Request) -> Response:
    """llama.cpp server's POST /embedding and /embeddings: each prompt's vector (the model's own pooling and
    normalization, as /v1/embeddings gives it), then llama.cpp's embd_normalize (by default unit length). Texts get
    the tokenizer's special tokens; a prompt past the context is a 400, as llama-server refuses it."""
    state, req = await _body(request, "embed", LlamaEmbeddingBody)
    tokenizer = state.text.tokenizer
    inputs = llama_inputs(req, lambda text, add_special: tokenizer.encode(text, add_special_tokens=add_special).ids)
    prompts = prompt_builder(state).embedding_inputs(inputs, None, True)
    vectors = await pool_prompts(request, prompts, request_deadline(request, state.settings.request_timeout))
    return JSONResponse(llama_embeddings_body([llama_normalized(v, req.embd_normalize) for v in vectors]))


def check_dimensions(state, dimensions: int | None) -> None:
    size = state.pooling.dimensions
    if dimensions is not None and size and dimensions > size:
        raise invalid(f"dimensions ({dimensions}) exceeds this model's embedding size ({size})", "dimensions")


async def rerank(request: Request, raw: Any = UNREAD) -> Response:
    state, req = await _body(request, "score", RerankRequest, raw=raw)
    deadline = request_deadline(request, state.settings.request_timeout)
    prompts = prompt_builder(state).pairs([req.query] * len(req.documents), req.documents, req.truncate_prompt_tokens,
                                    req.instruction)
    scores = [v[0] for v in await pool_prompts(request, prompts, deadline, req.priority)]
    return JSONResponse(rerank_body(_answered_name(state, req), req.documents, scores, req.top_n,
                                    req.return_documents, sum(map(len, prompts))))


async def cohere_rerank(request: Request) -> Response:
    state, req = await _body(request, "score", CohereRerankRequest)
    deadline = request_deadline(request, state.settings.request_timeout)
    prompts = prompt_builder(state).pairs([req.query] * len(req.documents), req.documents, None, req.instruction,
                                    req.max_tokens_per_doc)
    scores = [v[0] for v in await pool_prompts(request, prompts, deadline, req.priority)]
    return JSONResponse(cohere_rerank_body(req.documents, scores, req.top_n, req.return_documents,
                                           sum(map(len, prompts))))


async def score(request: Request) -> Response:
    state, req = await _body(request, "score", ScoreRequest)
    deadline = request_deadline(request, state.settings.request_timeout)
    pair = req.named_pair()
    if pair is None:
        names = ", ".join(" and ".join(p) for p in SCORE_SIDES)
        raise invalid(f"name the two sides to score as one of these pairs: {names}", SCORE_SIDES[0][0])
    first_name, second_name = pair
    first, second = getattr(req, first_name), getattr(req, second_name)
    firsts = [first] if isinstance(first, str) else first
    seconds = [second] if isinstance(second, str) else second
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    elif len(firsts) != len(seconds):
        raise invalid(f"{first_name} has {len(firsts)} texts and {second_name} {len(seconds)}: a list of "
                      f"{first_name} pairs with {second_name} one to one", second_name)
    prompts = prompt_builder(state).pairs(firsts, seconds, req.truncate_prompt_tokens, req.instruction)
    scores = [v[0] for v in await pool_prompts(request, prompts, deadline, req.priority)]
    return JSONResponse(score_body(_answered_name(state, req), scores, sum(map(len, prompts))))

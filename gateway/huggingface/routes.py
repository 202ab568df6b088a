"""The routes text-generation-inference (TGI) and text-embeddings-inference (TEI) share: GET /info, which says what
the server serves in the shape of the one its task makes it, and POST /, which runs the route TGI or TEI runs there
(TGI's generate, streamed or not as the body says; TEI's embed or rerank, as the model is an embedder or a scorer, and
on an embedder TEI's similarity for a {source_sentence, sentences} body).
Each route's own handlers live in tgi_routes.py and tei_routes.py."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.huggingface import tei_routes, tgi_routes
from gateway.openai.routes import ready_info
from gateway.server.client_io import read_json
from gateway.server.version import mili_version
from shared.request_limits import MAX_EMBEDDING_INPUTS, MAX_SCORE_DOCUMENTS


async def root(request: Request) -> Response:
    state = request.app.state.mili
    task = state.engine_config.task
    if task == "generate":
        return await tgi_routes.compat_generate(request)
    raw = await read_json(request, state.settings.max_body_bytes)
    if task == "score":
        return await tei_routes.rerank(request, raw)
    # An embedder's: /embed, or /similarity for a {source_sentence, sentences} pair (what TEI serves there when
    # started for sentence similarity, and what huggingface_hub's sentence_similarity sends).
    similarity = isinstance(raw, dict) and isinstance(raw.get("inputs"), dict)
    return await (tei_routes.similarity if similarity else tei_routes.embed)(request, raw)


async def info(request: Request) -> Response:
    state = request.app.state.mili
    ready = ready_info(state)
    config, name = state.engine_config, state.settings.served_model_name
    shared: dict[str, Any] = {"model_id": name, "model_sha": None, "model_dtype": ready.dtype,
                              "max_concurrent_requests": state.settings.num_workers * config.max_num_seqs,
                              "version": mili_version(), "sha": None, "docker_label": None}
    if config.task == "generate":  # TGI's
        return JSONResponse({**shared, "model_pipeline_tag": "text-generation", "model_device_type": ready.device,
                             "max_best_of": 1, "max_stop_sequences": state.settings.limits.max_stop,
                             "max_input_tokens": ready.max_model_len - 1, "max_total_tokens": ready.max_model_len,
                             "validation_workers": 1, "max_client_batch_size": 1, "router": "mili"})
    if config.task == "embed":  # TEI's
        model_type: dict[str, Any] = {"embedding": {"pooling": _TEI_POOLING.get(state.pooling.method,
                                                                                state.pooling.method)}}
        batch = MAX_EMBEDDING_INPUTS
    else:
        model_type = {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
        batch = MAX_SCORE_DOCUMENTS
    return JSONResponse({**shared, "served_model_name": name, "model_type": model_type,
                         "max_input_length": ready.max_model_len, "max_batch_tokens": config.max_num_batched_tokens,
                         "max_batch_requests": None, "max_client_batch_size": batch, "auto_truncate": True,
                         "tokenization_workers": 1})


# MILI's pooling methods by TEI's names (shared/pooling_config.py).
_TEI_POOLING = {"last": "last_token"}

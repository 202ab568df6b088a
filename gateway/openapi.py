"""The OpenAPI document served at /openapi.json, generated from the request models that validate
(gateway/openai/schema.py), so what it says is what the server checks.

Bounds that depend on the served model or the server's flags are filled in per server: token ids below
the vocabulary size, token arrays and max_tokens within the context length, n and stop strings within
--max-n, --max-stop-strings and --max-stop-length. What no schema can hold (a rendered prompt plus
max_tokens within the context; tool_choice naming one of tools; fields valid only together, as each
field's description says) is checked after validation and answered with a 400 naming the field.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pydantic.json_schema import models_json_schema

from gateway.anthropic.schema import CountTokensBody, MessagesBody
from gateway.huggingface.openapi_paths import tei_paths, tgi_paths, with_tei_rerank
from gateway.huggingface.tei_schema import TeiEmbedBody, TeiRerankBody, TeiSimilarityBody
from gateway.huggingface.tgi_schema import TgiGenerateBody
from gateway.llamacpp.completion_schema import LlamaCompletionBody, LlamaInfillBody, token_text_choices
from gateway.llamacpp.openapi_paths import llamacpp_paths, props_path
from gateway.openai.model_routes import MAX_LIST_LIMIT
from gateway.ollama.schema import OllamaChatBody, OllamaGenerateBody, OllamaPullBody, OllamaShowBody
from gateway.openai.parse import Limits, with_default_tag
from gateway.openai.schema import ChatBody, CompletionBody
from gateway.openai.tokenize_schema import DetokenizeBody, LlamaTokenizeBody, TokenizeChatBody, TokenizePromptBody
from gateway.pooling.schema import (CohereRerankRequest, EmbeddingRequest, LlamaEmbeddingBody, OllamaEmbeddingsRequest,
                                    OllamaEmbedRequest, RerankRequest, ScoreRequest)
from gateway.responses_api.schema import InputTokensBody, ResponsesBody
from gateway.server.deadlines import HEADER, MAX_TIMEOUT_S
from gateway.server.route_aliases import ALIASES
from gateway.streams.resume_routes import MAX_EVENT_ID_DIGITS
from shared.request_limits import TOKEN_ID_KEY_PATTERN, decimal_below

_REF = "#/components/schemas/{model}"
_JSON = "application/json"


@dataclass(frozen=True)
class ServedBounds:
    """What the document's bounds come from; vocab_size and max_model_len are None until a worker is ready."""

    models: tuple[str, ...]  # the served names, the first the one answers carry
    limits: Limits
    vocab_size: int | None = None
    max_model_len: int | None = None
    task: str = "generate"  # --task: which routes the server answers (the others are 400s, not listed)
    thinking: bool = True  # the model thinks (Qwen3's tags): Ollama's think may be on
    page: bool = False  # the chat page is served at GET / (gateway/web_ui/)
    infill: bool = False  # the served tokenizer has fill-in-the-middle tokens: llama.cpp's /infill runs
    embedding_size: int | None = None  # an embedding model's vector size: what `dimensions` may ask at most


@lru_cache(maxsize=1)
def _request_schemas() -> tuple[dict[str, dict], dict[str, Any]]:
    """(path's model name -> its $ref, every schema definition), as pydantic generates them."""
    refs, top = models_json_schema([(CompletionBody, "validation"), (ChatBody, "validation"),
                                    (ResponsesBody, "validation"), (InputTokensBody, "validation"),
                                    (TokenizePromptBody, "validation"),
                                    (TokenizeChatBody, "validation"), (DetokenizeBody, "validation"),
                                    (LlamaTokenizeBody, "validation"),
                                    (EmbeddingRequest, "validation"), (RerankRequest, "validation"),
                                    (CohereRerankRequest, "validation"), (ScoreRequest, "validation"),
                                    (MessagesBody, "validation"), (CountTokensBody, "validation"),
                                    (OllamaChatBody, "validation"), (OllamaGenerateBody, "validation"),
                                    (OllamaShowBody, "validation"), (OllamaPullBody, "validation"),
                                    (OllamaEmbedRequest, "validation"),
                                    (OllamaEmbeddingsRequest, "validation"), (TgiGenerateBody, "validation"),
                                    (TeiEmbedBody, "validation"), (TeiRerankBody, "validation"),
                                    (TeiSimilarityBody, "validation"), (LlamaCompletionBody, "validation"),
                                    (LlamaInfillBody, "validation"), (LlamaEmbeddingBody, "validation")],
                                   ref_template=_REF)
    return {model.__name__: ref for (model, _), ref in refs.items()}, top["$defs"]


def _fill_limits(node: Any, bounds: ServedBounds) -> None:
    """Replaces each `x-mili-limit` marker (gateway/openai/schema.py) with the served bound it names."""
    if isinstance(node, list):
        for item in node:
            _fill_limits(item, bounds)
        return
    if not isinstance(node, dict):
        return
    limit = node.pop("x-mili-limit", None)
    vocab, context = bounds.vocab_size, bounds.max_model_len
    if limit == "model":
        node["enum"] = list(bounds.models)
    elif limit == "ollama_model":  # Ollama's clients may add its default tag
        node["enum"] = sorted({*bounds.models, *map(with_default_tag, bounds.models)})
    elif limit == "token_id" and vocab is not None:
        node["maximum"] = vocab - 1
    elif limit == "token_id_key":  # the keys of a logit_bias object
        node["pattern"] = decimal_below(vocab) if vocab is not None else TOKEN_ID_KEY_PATTERN
    elif limit == "token_text" and vocab is not None:  # llama.cpp's: a token's id as text, or any other text
        node["anyOf"] = token_text_choices(decimal_below(vocab))
    elif limit == "context" and context is not None:
        if node.get("type") == "array":
            node["maxItems"] = context  # a whole context of prompt: only to score it (echo, max_tokens 0)
        else:
            node["maximum"] = context - 1  # every prompt has a token
    elif limit == "n":
        node["maximum"] = bounds.limits.max_n
    elif limit == "stop_length":
        node["maxLength"] = bounds.limits.max_stop_length
    elif limit == "stop_count":
        node["maxItems"] = bounds.limits.max_stop
    elif limit == "think" and not bounds.thinking:  # Ollama's 400 for a model without thinking
        node.pop("anyOf", None)
        node["enum"] = [False, None]
    elif limit == "context_tokens" and context is not None:  # a count of tokens that may fill the context
        node["maximum"] = context
    elif limit == "dimensions" and bounds.embedding_size:
        node["maximum"] = bounds.embedding_size
    elif limit == "priority" and not bounds.limits.priorities:
        node["minimum"] = node["maximum"] = 0  # first come, first served: only the default
    for value in node.values():
        _fill_limits(value, bounds)


# ----- responses -----

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"], "description": "the offending field, as a dotted path"},
        "code": {"type": ["string", "null"]}}}}}

_USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"], "properties": {
    "prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"},
    "total_tokens": {"type": "integer"}}}


# What the streaming endpoints' events carry.
_CHUNKS = ("a JSON chunk (an error object as the last one if the stream fails), then [DONE]; with "
           "--stream-resume-ttl each event has an id and the X-Stream-Id header names the stream to resume")
_TYPED_EVENTS = ("a typed event (its type also the SSE event name), from response.created to response.completed, "
                 "response.incomplete, or an error event and response.failed")


def _result(object_name: str) -> dict[str, Any]:
    return {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"], "properties": {
        "id": {"type": "string"}, "object": {"const": object_name}, "created": {"type": "integer"},
        "model": {"type": "string"}, "usage": _USAGE,
        "choices": {"type": "array", "items": {"type": "object", "required": ["index", "finish_reason"],
                                               "properties": {"index": {"type": "integer"}}}}}}


def _response_object() -> dict[str, Any]:
    """POST /v1/responses's result: a Responses API response object."""
    return {"type": "object", "required": ["id", "object", "created_at", "status", "model", "output", "usage"],
            "properties": {
                "id": {"type": "string"}, "object": {"const": "response"}, "created_at": {"type": "integer"},
                "status": {"enum": ["completed", "incomplete"]}, "model": {"type": "string"},
                "output": {"type": "array", "items": {"type": "object", "required": ["type", "id"], "properties": {
                    "type": {"enum": ["message", "reasoning", "function_call"]}}}},
                "usage": {"type": "object", "required": ["input_tokens", "output_tokens", "total_tokens"],
                          "properties": {"input_tokens": {"type": "integer"}, "output_tokens": {"type": "integer"},
                                         "total_tokens": {"type": "integer"}}}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "invalid request", 401: "missing or wrong API key", 404: "unknown model", 413: "body too large",
            429: "the API key is at its max_concurrent (code rate_limit_exceeded; Retry-After)",
            503: "no worker ready, queue full, or draining", 504: "deadline passed before anything was sent "
                                                                  "(code deadline_exceeded)"}
    return {str(c): {"description": text[c], "content": {_JSON: {"schema": _ERROR}}} for c in codes}


def _post(summary: str, ref: dict, result: dict[str, Any], events: str) -> dict[str, Any]:
    timeout = {"name": HEADER, "in": "header", "required": False,
               "description": "seconds the request may take end to end, queue included (overrides the server's "
                              "--request-timeout)",
               "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TIMEOUT_S}}
    # Each server-sent event: `events` says what; comment lines (`: ping`) keep an idle stream open.
    event = {"type": "object", "required": ["data"], "properties": {
        "data": {"type": "string", "description": events}, "event": {"type": "string"},
        "id": {"type": "string"}, "retry": {"type": "integer"}}}
    return {"post": {
        "summary": summary, "parameters": [timeout],
        "requestBody": {"required": True, "content": {_JSON: {"schema": ref}}},
        "responses": {
            "200": {"description": "the result; with stream: true, a text/event-stream",
                    "content": {_JSON: {"schema": result}, "text/event-stream": {"schema": event}}},
            **_errors(400, 401, 404, 413, 429, 503, 504)}}}


_ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"], "properties": {
        "type": {"type": "string", "description": "invalid_request_error, authentication_error, not_found_error, "
                                                  "rate_limit_error, overloaded_error (503), timeout_error, api_error"},
        "message": {"type": "string", "description": "what is wrong, naming the field"}}}}}
_ANTHROPIC_EVENTS = ("an event named as its data's type: message_start, content_block_start, content_block_delta, "
                     "content_block_stop, message_delta, message_stop, ping while the model is silent, or error")


def _message_object() -> dict[str, Any]:
    """POST /v1/messages's result: an Anthropic message."""
    usage = {"type": "object", "required": ["input_tokens", "output_tokens"], "properties": {
        name: {"type": "integer"} for name in ("input_tokens", "output_tokens", "cache_read_input_tokens",
                                               "cache_creation_input_tokens")}}
    return {"type": "object", "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
            "properties": {
                "id": {"type": "string"}, "type": {"const": "message"}, "role": {"const": "assistant"},
                "model": {"type": "string"},
                "content": {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {
                    "type": {"enum": ["text", "thinking", "tool_use"]}}}},
                "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]},
                "stop_sequence": {"type": ["string", "null"]}, "usage": usage}}


def _anthropic(route: dict[str, Any]) -> dict[str, Any]:
    """A route of Anthropic's API: its errors are Anthropic error objects."""
    for response in route["post"]["responses"].values():
        if response.get("content", {}).get(_JSON, {}).get("schema") is _ERROR:
            response["content"] = {_JSON: {"schema": _ANTHROPIC_ERROR}}
    return route


def _token_route(summary: str, body: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    return {"post": {"summary": summary, "requestBody": {"required": True, "content": {_JSON: {"schema": body}}},
                     "responses": {"200": {"description": "the result", "content": {_JSON: {"schema": result}}},
                                   **_errors(400, 401, 404, 413)}}}


_TOKENIZED = {"type": "object", "required": ["count", "max_model_len", "tokens", "token_strs"], "properties": {
    "count": {"type": "integer"}, "max_model_len": {"type": ["integer", "null"]},
    "tokens": {"type": "array", "items": {"type": "integer"}},
    "token_strs": {"type": ["array", "null"], "items": {"type": "string"}}}}
_LLAMA_TOKENIZED = {"type": "object", "required": ["tokens"], "additionalProperties": False, "properties": {
    "tokens": {"type": "array", "items": {"oneOf": [
        {"type": "integer"},
        {"type": "object", "required": ["id", "piece"], "properties": {
            "id": {"type": "integer"},
            "piece": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]}}}]}}}}
_DETOKENIZED = {"type": "object", "required": ["prompt", "content"],
                "properties": {"prompt": {"type": "string"}, "content": {"type": "string"}}}


_USAGE_ONLY = {"type": "object", "required": ["prompt_tokens", "total_tokens"],
               "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}}}
_EMBEDDINGS = {"type": "object", "required": ["object", "data", "model", "usage"], "properties": {
    "object": {"const": "list"}, "model": {"type": "string"}, "usage": _USAGE_ONLY,
    "data": {"type": "array", "items": {"type": "object", "required": ["object", "index", "embedding"], "properties": {
        "object": {"const": "embedding"}, "index": {"type": "integer"},
        "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}},
                                {"type": "string", "description": "base64 of little-endian float32"}]}}}}}}
_LLAMA_EMBEDDINGS = {"type": "array", "items": {"type": "object", "required": ["index", "embedding"], "properties": {
    "index": {"type": "integer"},
    "embedding": {"type": "array", "minItems": 1, "maxItems": 1,
                  "items": {"type": "array", "items": {"type": "number"}}}}}}
_RERANKED = {"type": "object", "required": ["id", "model", "usage", "results"], "properties": {
    "id": {"type": "string"}, "model": {"type": "string"}, "usage": _USAGE_ONLY,
    "results": {"type": "array", "items": {"type": "object", "required": ["index", "relevance_score"], "properties": {
        "index": {"type": "integer"}, "relevance_score": {"type": "number"},
        "document": {"type": "object", "properties": {"text": {"type": "string"}}}}}}}}
_COHERE_RERANKED = {"type": "object", "required": ["id", "results", "meta"], "properties": {
    "id": {"type": "string"}, "results": _RERANKED["properties"]["results"],
    "meta": {"type": "object", "properties": {
        "api_version": {"type": "object", "properties": {"version": {"type": "string"},
                                                         "is_experimental": {"type": "boolean"}}},
        "billed_units": {"type": "object", "properties": {"search_units": {"type": "integer"}}},
        "tokens": {"type": "object", "properties": {"input_tokens": {"type": "integer"},
                                                    "output_tokens": {"type": "integer"}}}}}}}
_SCORES = {"type": "object", "required": ["id", "object", "created", "model", "data", "usage"], "properties": {
    "id": {"type": "string"}, "object": {"const": "list"}, "created": {"type": "integer"}, "model": {"type": "string"},
    "usage": _USAGE_ONLY, "data": {"type": "array", "items": {"type": "object", "required": ["index", "score"],
                                                               "properties": {"index": {"type": "integer"},
                                                                              "score": {"type": "number"}}}}}}


def _pooling_route(summary: str, body: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    return {"post": {"summary": summary, "requestBody": {"required": True, "content": {_JSON: {"schema": body}}},
                     "responses": {"200": {"description": "the result", "content": {_JSON: {"schema": result}}},
                                   **_errors(400, 401, 404, 413, 429, 503, 504)}}}


# Ollama's API (gateway/ollama/): its errors are {"error": message}; chat and generate stream newline-delimited JSON
# unless `stream` is false.
_OLLAMA_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
_NDJSON = "application/x-ndjson"
_OLLAMA_STATUSES = (400, 401, 404, 413, 429, 503, 504)


def _ollama_errors(*codes: int) -> dict[str, Any]:
    return {code: {**response, "content": {_JSON: {"schema": _OLLAMA_ERROR}}}
            for code, response in _errors(*codes).items()}


def _ollama_post(summary: str, ref: dict, result: dict[str, Any], streams: bool = False) -> dict[str, Any]:
    content = {_JSON: {"schema": result}}
    if streams:
        content[_NDJSON] = {"schema": {"type": "string", "description": "one JSON object a line, the last with done: "
                                                                        "true (or an error object)"}}
    return {"post": {"summary": summary, "requestBody": {"required": True, "content": {_JSON: {"schema": ref}}},
                     "responses": {"200": {"description": "the result" + ("; by default streamed" if streams else ""),
                                           "content": content},
                                   **_ollama_errors(*_OLLAMA_STATUSES)}}}


def _ollama_get(description: str) -> dict[str, Any]:
    return {"get": {"responses": {"200": {"description": description, "content": {_JSON: {"schema": {
        "type": "object"}}}}, **_ollama_errors(401)}}}


_OLLAMA_DONE = {"type": "object", "required": ["model", "created_at", "done"], "properties": {
    "model": {"type": "string"}, "created_at": {"type": "string"}, "done": {"type": "boolean"},
    "done_reason": {"type": "string", "description": "stop, length, or load (nothing to generate)"}}}


def _ollama_paths(task: str, refs: dict[str, dict]) -> dict[str, Any]:
    """Ollama's routes a --task answers."""
    if task == "embed":
        return {"/api/embed": _ollama_post("Embeddings (Ollama's API)", refs["OllamaEmbedRequest"], {
                    "type": "object", "required": ["model", "embeddings"], "properties": {
                        "embeddings": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}}}),
                "/api/embeddings": _ollama_post("One embedding (Ollama's older API)", refs["OllamaEmbeddingsRequest"], {
                    "type": "object", "required": ["embedding"], "properties": {
                        "embedding": {"type": "array", "items": {"type": "number"}}}})}
    if task != "generate":
        return {}
    return {
        "/api/chat": _ollama_post("Chat (Ollama's API)", refs["OllamaChatBody"], _OLLAMA_DONE, streams=True),
        "/api/generate": _ollama_post("Generate (Ollama's API; raw: no chat template)", refs["OllamaGenerateBody"],
                                      _OLLAMA_DONE, streams=True),
        "/api/show": _ollama_post("The served model's details (Ollama's API)", refs["OllamaShowBody"], {
            "type": "object", "required": ["details", "model_info", "capabilities"]}),
        "/api/pull": _ollama_post("Pull a model (Ollama's API): the served one is here already", refs["OllamaPullBody"],
                                  {"type": "object", "required": ["status"], "properties": {"status": {
                                      "const": "success"}}}, streams=True),
        "/api/tags": _ollama_get("the served model, as Ollama lists models"),
        "/api/ps": _ollama_get("the served model once loaded, as Ollama lists running models"),
        "/api/version": _ollama_get("MILI's version"),
    }


def _stored_response_paths() -> dict[str, Any]:
    """GET and DELETE /v1/responses/{response_id}, GET .../input_items: stored responses (the caller's own)."""
    response_id = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"},
                   "description": "a stored response's id (another caller's, or an unknown one, is a 404)"}
    deleted = {"type": "object", "required": ["id", "object", "deleted"], "properties": {
        "id": {"type": "string"}, "object": {"const": "response"}, "deleted": {"const": True}}}
    items = {"type": "object", "required": ["object", "data", "has_more"], "properties": {
        "object": {"const": "list"}, "has_more": {"type": "boolean"},
        "data": {"type": "array", "items": {"type": "object", "required": ["id", "type"]}}}}
    paging = [{"name": "order", "in": "query", "required": False, "schema": {"enum": ["asc", "desc"]},
               "description": "desc (the default): the newest item first"},
              {"name": "limit", "in": "query", "required": False,
               "schema": {"type": "integer", "minimum": 1, "maximum": 100}, "description": "items per page"},
              {"name": "after", "in": "query", "required": False, "schema": {"type": "string"},
               "description": "the id of the item the page starts after (one not among them is a 404)"}]

    def answer(schema: dict[str, Any], *codes: int) -> dict[str, Any]:
        return {"200": {"description": "the result", "content": {_JSON: {"schema": schema}}}, **_errors(*codes)}

    return {
        "/v1/responses/{response_id}": {
            "get": {"operationId": "retrieveResponse", "summary": "A stored response", "parameters": [response_id],
                    "responses": answer(_response_object(), 401, 404)},
            "delete": {"operationId": "deleteResponse", "summary": "Drop a stored response",
                       "parameters": [response_id], "responses": answer(deleted, 401, 404)}},
        "/v1/responses/{response_id}/input_items": {
            "get": {"operationId": "listInputItems",
                    "summary": "The items a stored response was made from: earlier turns', then its input",
                    "parameters": [response_id, *paging], "responses": answer(items, 400, 401, 404)}},
    }


def _task_paths(task: str, refs: dict[str, dict], infill: bool) -> dict[str, Any]:
    """The routes a --task answers beside the common ones."""
    if task == "embed":
        llama = _pooling_route("Embeddings (llama.cpp server's shape: per prompt its index and [vector], normalized "
                               "by embd_normalize)", refs["LlamaEmbeddingBody"], _LLAMA_EMBEDDINGS)
        return {"/v1/embeddings": _pooling_route("Embeddings (OpenAI's shape)", refs["EmbeddingRequest"], _EMBEDDINGS),
                "/embedding": llama, "/embeddings": llama, **tei_paths(task, refs, _ERROR)}
    if task == "score":
        rerank = with_tei_rerank(_pooling_route("Rerank documents by relevance to a query (Jina's and Cohere's v1 "
                                                "shape)", refs["RerankRequest"], _RERANKED), refs)
        cohere = _pooling_route("Rerank documents by relevance to a query (Cohere's API v2)",
                                refs["CohereRerankRequest"], _COHERE_RERANKED)
        score = _pooling_route("Score text pairs (vLLM's route)", refs["ScoreRequest"], _SCORES)
        return {"/v1/rerank": rerank, "/rerank": rerank, "/v2/rerank": cohere, "/score": score, "/v1/score": score,
                **tei_paths(task, refs, _ERROR)}
    return {
        "/v1/completions": _post("Text completion", refs["CompletionBody"], _result("text_completion"), _CHUNKS),
        "/v1/chat/completions": _post("Chat completion", refs["ChatBody"], _result("chat.completion"), _CHUNKS),
        "/v1/responses": _post("Response (OpenAI's Responses API)", refs["ResponsesBody"],
                               _response_object(), _TYPED_EVENTS),
        "/v1/responses/input_tokens": _token_route(
            "Count a Responses request's input tokens (as /v1/responses renders it)", refs["InputTokensBody"],
            {"type": "object", "required": ["object", "input_tokens"], "properties": {
                "object": {"const": "response.input_tokens"}, "input_tokens": {"type": "integer"}}}),
        **_stored_response_paths(),
        "/v1/messages": _anthropic(_post("Message (Anthropic's Messages API)", refs["MessagesBody"],
                                         _message_object(), _ANTHROPIC_EVENTS)),
        "/v1/messages/count_tokens": _anthropic(_token_route(
            "Count a Messages request's input tokens (as /v1/messages renders it)", refs["CountTokensBody"],
            {"type": "object", "required": ["input_tokens"], "properties": {"input_tokens": {"type": "integer"}}})),
        **tgi_paths(refs, _ERROR),
        **llamacpp_paths(refs, _post, infill),
        "/apply-template": _token_route(
            "A conversation as the chat template renders it for a chat request, not run (llama.cpp's route)",
            refs["TokenizeChatBody"], {"type": "object", "required": ["prompt"], "additionalProperties": False,
                                       "properties": {"prompt": {"type": "string"}}}),
    }


def _get(description: str, media: str = _JSON, *extra: int) -> dict[str, Any]:
    schema = {"type": "object"} if media == _JSON else {"type": "string"}
    return {"get": {"responses": {"200": {"description": description, "content": {media: {"schema": schema}}},
                                  **_errors(401, *extra)}}}


def _resume() -> dict[str, Any]:
    error = {"content": {_JSON: {"schema": _ERROR}}}
    event = {"type": "object", "required": ["data"], "properties": {
        "data": {"type": "string"}, "id": {"type": "string"}, "event": {"type": "string"}}}
    return {"get": {
        "summary": "Resume a stream (with --stream-resume-ttl): the events after Last-Event-ID, then live to [DONE]",
        "parameters": [
            {"name": "stream_id", "in": "path", "required": True, "schema": {"type": "string"},
             "description": "the X-Stream-Id header of the streaming response"},
            {"name": "Last-Event-ID", "in": "header", "required": False,
             "schema": {"type": "integer", "minimum": 0, "maximum": 10**MAX_EVENT_ID_DIGITS - 1},
             "description": "the id of the last event received (without it: from the first event)"}],
        "responses": {"200": {"description": "text/event-stream, each event with its id",
                              "content": {"text/event-stream": {"schema": event}}},
                      "400": {"description": "Last-Event-ID not an integer or beyond the last event", **error},
                      "401": {"description": "missing or wrong API key", **error},
                      "404": {"description": "unknown or expired id, or another API key's (code stream_not_found)",
                              **error}}}}


def _models() -> dict[str, Any]:
    """GET /v1/models with Anthropic's paging parameters (gateway/openai/model_routes.py)."""
    listed = _get("the served model's card, read by OpenAI's and Anthropic's SDKs alike", _JSON, 400)
    listed["get"]["parameters"] = [
        {"name": "limit", "in": "query", "required": False,
         "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT}, "description": "cards per page"},
        *({"name": name, "in": "query", "required": False, "schema": {"type": "string"},
           "description": f"Anthropic's cursor: the cards {side} this id"}
          for name, side in (("after_id", "after"), ("before_id", "before")))]
    return listed


def _model() -> dict[str, Any]:
    """GET /v1/models/{model}: the card of the served model (or its Ollama tag), else 404."""
    retrieved = _get("the served model's card", _JSON, 404)
    retrieved["get"]["parameters"] = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"},
                                       "description": "the served model name"}]
    return retrieved


def document(bounds: ServedBounds) -> dict[str, Any]:
    refs, definitions = _request_schemas()
    schemas = copy.deepcopy(definitions)
    _fill_limits(schemas, bounds)
    health = {"get": {"responses": {
        "200": {"description": "a worker is ready", "content": {_JSON: {"schema": {"type": "object"}}}},
        "503": {"description": "loading, no worker alive, or draining",
                "content": {_JSON: {"schema": {"type": "object"}}}}}}}
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "MILI", "version": "0.1.0",
                 "description": f"OpenAI-compatible API serving {bounds.models[0]}"},
        "paths": {
            **_task_paths(bounds.task, refs, bounds.infill),
            **_ollama_paths(bounds.task, refs),
            "/tokenize": _token_route("Count a prompt's or a conversation's tokens (vLLM's route; llama.cpp's "
                                      "`content` body too)",
                                      {"oneOf": [refs["TokenizePromptBody"], refs["TokenizeChatBody"],
                                                 refs["LlamaTokenizeBody"]]},
                                      {"oneOf": [_TOKENIZED, _LLAMA_TOKENIZED]}),
            "/detokenize": _token_route("Token ids back to text (vLLM's and llama.cpp's route)", refs["DetokenizeBody"],
                                        _DETOKENIZED),
            "/v1/models": _models(),
            "/v1/models/{model}": _model(),
            "/health": health,
            "/metrics": _get("Prometheus metrics", "text/plain"),
            "/version": _get("the server's version"),
            "/props": props_path(_errors(401)),
            "/debug/kv": _get("each worker's KV block ledger", _JSON, 503),
            "/v1/streams/{stream_id}": _resume(),
        },
        "components": {"schemas": schemas},
    }
    _note_aliases(doc["paths"])
    if bounds.page:
        page = {"summary": "The chat page (no API key needed)", "responses": {
            "200": {"description": "the page", "content": {"text/html": {"schema": {"type": "string"}}}}}}
        doc["paths"].setdefault("/", {})["get"] = page
    return doc


def _note_aliases(paths: dict[str, Any]) -> None:
    """Each route with other spellings (llama-server's, gateway/server/route_aliases.py) says so; the aliases are not
    listed again."""
    for path in set(ALIASES.values()) & set(paths):
        spellings = ", ".join(sorted(alias for alias, target in ALIASES.items() if target == path))
        for operation in paths[path].values():
            operation["description"] = f"Also served at {spellings}, as llama-server serves them."

"""The OpenAPI description of Hugging Face's TGI and TEI routes (gateway/openapi.py puts them in /openapi.json): their
bodies, their answers, and their errors, `{"error", "error_type"}` (a missing API key is refused before any route,
in OpenAI's shape, which the caller passes in)."""

from __future__ import annotations

from typing import Any

_JSON = "application/json"
HF_ERROR = {"type": "object", "required": ["error", "error_type"], "properties": {
    "error": {"type": "string"}, "error_type": {"type": "string", "description": "TGI: validation, overloaded, "
                                               "unhealthy, generation; TEI: Empty, Validation, Overloaded, Unhealthy"}}}
_STATUSES = {400: "TEI: no input (Empty)", 413: "body too large", 422: "a request it cannot take (validation)",
             429: "the API key is at its max_concurrent", 503: "no worker ready, queue full, or draining",
             504: "deadline passed before anything was sent"}
_TOKEN = {"type": "object", "required": ["id", "text", "logprob", "special"], "properties": {
    "id": {"type": "integer"}, "text": {"type": "string"}, "logprob": {"type": ["number", "null"]},
    "special": {"type": "boolean"}}}
_GENERATED = {"type": "object", "required": ["generated_text"], "properties": {
    "generated_text": {"type": "string"},
    "details": {"type": "object", "required": ["finish_reason", "generated_tokens", "tokens"], "properties": {
        "finish_reason": {"enum": ["length", "eos_token", "stop_sequence"]}, "generated_tokens": {"type": "integer"},
        "seed": {"type": ["integer", "null"]}, "prefill": {"type": "array"},
        "tokens": {"type": "array", "items": _TOKEN}, "top_tokens": {"type": "array"}}}}}
_STREAM_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {
    "type": "string", "description": "per token {index, token, top_tokens, generated_text (the last only), details "
                                     "(the last only, when asked)}, or {error, error_type}; no [DONE]"}}}
_VECTORS = {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
_COSINES = {"type": "array", "items": {"type": "number"}}
_RANKED = {"type": "array", "items": {"type": "object", "required": ["index", "score"], "properties": {
    "index": {"type": "integer"}, "score": {"type": "number"}, "text": {"type": "string"}}}}


def _errors(key_error: dict[str, Any], *codes: int) -> dict[str, Any]:
    errors = {str(c): {"description": _STATUSES[c], "content": {_JSON: {"schema": HF_ERROR}}} for c in codes}
    return {**errors, "401": {"description": "missing or wrong API key", "content": {_JSON: {"schema": key_error}}}}


def _post(summary: str, body: dict[str, Any], content: dict[str, Any], key_error: dict[str, Any],
          *codes: int) -> dict[str, Any]:
    return {"post": {"summary": summary, "requestBody": {"required": True, "content": {_JSON: {"schema": body}}},
                     "responses": {"200": {"description": "the result", "content": content},
                                   **_errors(key_error, *codes)}}}


def _info(description: str, key_error: dict[str, Any]) -> dict[str, Any]:
    return {"get": {"summary": description, "responses": {
        "200": {"description": "the served model", "content": {_JSON: {"schema": {
            "type": "object", "required": ["model_id", "version"]}}}},
        **_errors(key_error, 503)}}}


def tgi_paths(refs: dict[str, dict], key_error: dict[str, Any]) -> dict[str, Any]:
    body, codes = refs["TgiGenerateBody"], (413, 422, 429, 503, 504)
    events = {"text/event-stream": {"schema": _STREAM_EVENT}}
    return {
        "/generate": _post("Generate (TGI's API)", body, {_JSON: {"schema": _GENERATED}}, key_error, *codes),
        "/generate_stream": _post("Generate, streamed (TGI's API)", body, events, key_error, *codes),
        "/": _post("Generate (TGI's route: streamed with stream true; else a one-element array)", body,
                   {_JSON: {"schema": {"type": "array", "items": _GENERATED}}, **events}, key_error, *codes),
        "/info": _info("The served model (TGI's shape)", key_error),
    }


def tei_paths(task: str, refs: dict[str, dict], key_error: dict[str, Any]) -> dict[str, Any]:
    codes = (400, 413, 422, 429, 503, 504)
    if task == "embed":
        embed = _post("Embed (TEI's API)", refs["TeiEmbedBody"], {_JSON: {"schema": _VECTORS}}, key_error, *codes)
        similarity = _post("Cosine of a sentence with others (TEI's API)", refs["TeiSimilarityBody"],
                           {_JSON: {"schema": _COSINES}}, key_error, *codes)
        either = _post("Embed, or with inputs {source_sentence, sentences} the cosines (TEI's route)",
                       {"oneOf": [refs["TeiEmbedBody"], refs["TeiSimilarityBody"]]},
                       {_JSON: {"schema": {"oneOf": [_VECTORS, _COSINES]}}}, key_error, *codes)
        return {"/embed": embed, "/similarity": similarity, "/": either,
                "/info": _info("The served model (TEI's shape)", key_error)}
    rerank = _post("Rerank texts (TEI's API)", refs["TeiRerankBody"], {_JSON: {"schema": _RANKED}}, key_error, *codes)
    return {"/": rerank, "/info": _info("The served model (TEI's shape)", key_error)}


def with_tei_rerank(jina: dict[str, Any], refs: dict[str, dict]) -> dict[str, Any]:
    """/rerank and /v1/rerank: Jina's and Cohere's v1 body or TEI's (`texts`), each answered in its own shape."""
    post = jina["post"]
    body = post["requestBody"]["content"][_JSON]["schema"]
    post["requestBody"]["content"][_JSON]["schema"] = {"oneOf": [body, refs["TeiRerankBody"]]}
    ok = post["responses"]["200"]["content"][_JSON]
    ok["schema"] = {"oneOf": [ok["schema"], _RANKED]}
    for code, response in post["responses"].items():
        if code in ("400", "413", "429", "503", "504"):
            schema = response["content"][_JSON]["schema"]
            response["content"][_JSON]["schema"] = {"oneOf": [schema, HF_ERROR]}
    post["responses"]["422"] = {"description": _STATUSES[422], "content": {_JSON: {"schema": HF_ERROR}}}
    post["summary"] += "; or TEI's (texts)"
    return jina

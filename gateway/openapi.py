"""The OpenAPI description served at /openapi.json: the routes, their parameters and error shape."""

from __future__ import annotations

from typing import Any

_NUMBER = {"type": "number"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_STOP = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}

_SAMPLING = {
    "model": {"type": "string"}, "n": _INT, "temperature": _NUMBER, "top_p": _NUMBER, "stop": _STOP, "seed": _INT,
    "presence_penalty": _NUMBER, "frequency_penalty": _NUMBER,
    "logit_bias": {"type": "object", "additionalProperties": _NUMBER}, "stream": _BOOL,
    "stream_options": {"type": "object", "properties": {"include_usage": _BOOL}}, "user": {"type": "string"},
    # Extensions, as vLLM names them.
    "top_k": _INT, "min_p": _NUMBER, "repetition_penalty": _NUMBER, "ignore_eos": _BOOL, "min_tokens": _INT,
    "stop_token_ids": {"type": "array", "items": _INT},
    # Per prompt token: {token id: {logprob, rank, decoded_token}}, the first null; not with stream.
    "prompt_logprobs": {**_INT, "minimum": 0, "maximum": 20},
}

_COMPLETION = {"type": "object", "required": ["model", "prompt"], "properties": {
    # max_tokens 0 (with echo) scores the prompt without generating; echo + logprobs covers the prompt too.
    **_SAMPLING, "max_tokens": {**_INT, "minimum": 0}, "echo": _BOOL, "logprobs": _INT,
    "prompt": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}},
                         {"type": "array", "items": _INT}, {"type": "array", "items": {"type": "array", "items": _INT}}]},
}}

_FUNCTION_CALL = {"type": "object", "required": ["function"], "properties": {
    "id": {"type": "string"}, "type": {"enum": ["function"]},
    "function": {"type": "object", "required": ["name", "arguments"], "properties": {
        "name": {"type": "string"}, "arguments": {"type": "string", "description": "a JSON object, as text"}}}}}

_MESSAGE = {"type": "object", "required": ["role"], "properties": {
    "role": {"enum": ["system", "developer", "user", "assistant", "tool"]}, "name": {"type": "string"},
    "content": {"oneOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {
        "type": "object", "properties": {"type": {"enum": ["text"]}, "text": {"type": "string"}}}}]},
    "tool_calls": {"type": "array", "items": _FUNCTION_CALL, "description": "assistant turns"},
    "tool_call_id": {"type": "string", "description": "tool turns: the call this result answers"},
}}

_TOOL = {"type": "object", "required": ["type", "function"], "properties": {
    "type": {"enum": ["function"]},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"}, "description": {"type": "string"},
        "parameters": {"type": "object", "description": "JSON schema of the arguments"}, "strict": _BOOL}}}}

_RESPONSE_FORMAT = {"oneOf": [
    {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
    {"type": "object", "required": ["type", "json_schema"], "properties": {
        "type": {"enum": ["json_schema"]},
        "json_schema": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "description": {"type": "string"}, "schema": {"type": "object"},
            "strict": _BOOL}}}}]}

_CHAT = {"type": "object", "required": ["model", "messages"], "properties": {
    **_SAMPLING, "messages": {"type": "array", "items": _MESSAGE}, "max_tokens": _INT, "max_completion_tokens": _INT,
    "logprobs": _BOOL, "top_logprobs": _INT, "response_format": _RESPONSE_FORMAT,
    "tools": {"type": "array", "items": _TOOL},
    "tool_choice": {"oneOf": [{"enum": ["none", "auto", "required"]}, {
        "type": "object", "required": ["type", "function"], "properties": {
            "type": {"enum": ["function"]}, "function": {"type": "object", "required": ["name"],
                                                          "properties": {"name": {"type": "string"}}}}}]},
    "parallel_tool_calls": _BOOL,
    "chat_template_kwargs": {"type": "object"},
}}

_ERROR = {"type": "object", "properties": {"error": {"type": "object", "properties": {
    "message": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]},
    "code": {"type": ["string", "null"]}}}}}


def _post(summary: str, schema: dict) -> dict[str, Any]:
    errors = {str(code): {"description": text, "content": {"application/json": {"schema": _ERROR}}}
              for code, text in ((400, "invalid request"), (401, "missing or wrong API key"), (404, "unknown model"),
                                 (413, "body too large"),
                                 (429, "the API key is at its max_concurrent (code rate_limit_exceeded; Retry-After)"),
                                 (503, "no worker ready, queue full, or draining"),
                                 (504, "deadline passed before anything was sent (code deadline_exceeded)"))}
    timeout = {"name": "X-Request-Timeout", "in": "header", "required": False,
               "description": "seconds the request may take end to end, queue included (overrides the server's "
                              "--request-timeout)", "schema": {"type": "number", "exclusiveMinimum": 0}}
    return {"post": {"summary": summary, "parameters": [timeout], "requestBody": {"required": True,
                                                         "content": {"application/json": {"schema": schema}}},
                     "responses": {"200": {"description": "a JSON response, or text/event-stream when stream is true "
                                                          "(with --stream-resume-ttl: each event with an id, and the "
                                                          "X-Stream-Id header to resume it by)"},
                                   **errors}}}


def _resume() -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": _ERROR}}}
    return {"get": {
        "summary": "Resume a stream (with --stream-resume-ttl): the events after Last-Event-ID, then live to [DONE]",
        "parameters": [
            {"name": "stream_id", "in": "path", "required": True, "schema": {"type": "string"},
             "description": "the X-Stream-Id header of the streaming response"},
            {"name": "Last-Event-ID", "in": "header", "required": False, "schema": {"type": "integer", "minimum": 0},
             "description": "the id of the last event received (without it: from the first event)"}],
        "responses": {"200": {"description": "text/event-stream, each event with its id"},
                      "400": {"description": "Last-Event-ID not an integer or beyond the last event", **error},
                      "404": {"description": "unknown or expired id, or another API key's (code stream_not_found)",
                              **error}}}}


def document(model: str) -> dict[str, Any]:
    get = {"get": {"responses": {"200": {"description": "OK"}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "MILI", "version": "0.1.0", "description": f"OpenAI-compatible API serving {model}"},
        "paths": {
            "/v1/completions": _post("Text completion", _COMPLETION),
            "/v1/chat/completions": _post("Chat completion", _CHAT),
            "/v1/streams/{stream_id}": _resume(),
            "/v1/models": get,
            "/health": {"get": {"responses": {"200": {"description": "a worker is ready"},
                                              "503": {"description": "loading, no worker alive, or draining"}}}},
            "/metrics": get,
            "/debug/kv": {"get": {"responses": {"200": {"description": "each worker's KV block ledger"}}}},
        },
    }

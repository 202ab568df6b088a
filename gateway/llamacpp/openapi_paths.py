"""The OpenAPI description of llama.cpp server's own routes (gateway/openapi.py puts them in /openapi.json): POST
/completion (and its /completions spelling), POST /infill where the served tokenizer has fill-in-the-middle tokens
(without them every call is a 501, so the route is not described), and GET /props. Their errors are the OpenAI-shaped
error object llama-server answers with too, so the caller's route builder (`post`) supplies them."""

from __future__ import annotations

from typing import Any, Callable

_JSON = "application/json"
_INT = {"type": "integer"}
_STRING = {"type": "string"}
_PROBABILITY = {"type": "object", "required": ["id", "token", "logprob"], "properties": {
    "id": _INT, "token": _STRING, "logprob": {"type": "number"}, "bytes": {"type": ["array", "null"], "items": _INT},
    "top_logprobs": {"type": "array", "items": {"type": "object", "required": ["id", "token", "logprob"]}}}}
# The whole answer. With response_fields only the fields named are there, a nested one under its path
# ("timings/prompt_n"), so none is required; each has its type wherever it is.
ANSWER = {"type": "object", "properties": {
    "index": _INT, "content": _STRING, "tokens": {"type": "array", "items": _INT}, "id_slot": _INT,
    "stop": {"type": "boolean"}, "model": _STRING, "tokens_predicted": _INT, "tokens_evaluated": _INT,
    "tokens_cached": _INT, "generation_settings": {"type": "object"}, "prompt": _STRING,
    "has_new_line": {"type": "boolean"}, "truncated": {"type": "boolean"},
    "stop_type": {"enum": ["eos", "word", "limit", "none"],
                  "description": "eos: the end token, a stop token or a finished grammar; word: a stop string "
                                 "(stopping_word); limit: n_predict, the context, n_indent or t_max_predict_ms"},
    "stopping_word": _STRING,
    "timings": {"type": "object", "properties": {name: {"type": "number"} for name in (
        "cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n", "predicted_ms",
        "predicted_per_token_ms", "predicted_per_second")}},
    "completion_probabilities": {"type": "array", "items": _PROBABILITY}}}
EVENTS = ("a JSON object per piece of text {content, tokens, stop: false, ...}, then one with stop: true and the whole "
          "answer's other fields; no [DONE]. A failure after the stream started is a last {error} event")
PROPS = {"type": "object", "required": ["default_generation_settings", "total_slots", "model_alias", "chat_template"],
         "properties": {
             "default_generation_settings": {"type": "object", "properties": {
                 "n_ctx": {"type": ["integer", "null"], "description": "the context length (null while loading)"},
                 "params": {"type": "object"}}},
             "total_slots": _INT, "model_alias": _STRING, "model_path": _STRING,
             "chat_template": {"type": "string", "description": "the served chat template (empty for a pooling "
                                                                "model)"},
             "modalities": {"type": "object"}, "build_info": _STRING, "is_sleeping": {"type": "boolean"}}}

Post = Callable[[str, dict, dict, str], dict[str, Any]]


def llamacpp_paths(refs: dict[str, dict], post: Post, infill: bool) -> dict[str, Any]:
    """The generating routes. `post(summary, body ref, result schema, events)`: a POST route with the server's
    deadline header and errors; `infill`: the served tokenizer has fill-in-the-middle tokens."""
    completion = post("Completion (llama.cpp server's API); streamed as data-only server-sent events",
                      refs["LlamaCompletionBody"], ANSWER, EVENTS)
    paths = {"/completion": completion, "/completions": completion}
    if infill:
        paths["/infill"] = post("Code at an editor's cursor, filled in (llama.cpp server's API: the prompt laid out "
                                "as llama-server lays it out)", refs["LlamaInfillBody"], ANSWER, EVENTS)
    return paths


def props_path(errors: dict[str, Any]) -> dict[str, Any]:
    """GET /props: what llama-server's clients read before they post."""
    return {"get": {"summary": "The context length, chat template and slots (llama.cpp server's API)", "responses": {
        "200": {"description": "the server's settings", "content": {_JSON: {"schema": PROPS}}}, **errors}}}

"""An Ollama request as the Chat Completions (or, for a raw /api/generate, the Completions) request it means, so all
of them share one set of checks, one grammar path and one path to the worker.

The translation:
- `options`: num_predict is max_tokens (0 or a negative one, Ollama's "until the context ends", is no limit);
  temperature, top_p, top_k, min_p, seed, stop, presence_penalty and frequency_penalty map across; repeat_penalty is
  vLLM's repetition_penalty. Loading options (num_ctx, num_gpu, ...) and keep_alive change nothing.
- `format`: "json" is a JSON object (response_format json_object), a schema is json_schema; "" is none.
- `think`: true (or a level, "low" / "medium" / "high") sets the template's enable_thinking, false clears it.
  On a model without thinking (no "thinking" in /api/show's capabilities) true or a level is a 400, as Ollama's.
- Messages keep their roles; a final assistant message with text is continued (a prefill), as Ollama's templates
  leave the last assistant turn open. An assistant turn's tool_calls (arguments as objects) get ids where they
  have none, and each later tool message answers the first unanswered call of its tool_name (or, without one, the
  first unanswered call): Ollama's messages carry no call ids. Images are a 400: the served model reads text only.
- /api/generate: `system` and `prompt` are the system and user messages of a one-turn chat; with `raw` the prompt
  is completed as it is, with no template, and with a `suffix` the completion fills in the middle
  (gateway/text/fill_in_middle.py). `template` and `context` are refused (the model's template only; conversations
  go through /api/chat).
A 400 from the chat checks names the Ollama field it came from.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from gateway.ollama.schema import OllamaChatBody, OllamaGenerateBody, OllamaMessage
from gateway.openai.parse import PREFILL, ends_in_prefill, without_default_tag
from gateway.server.errors import params_renamed

# A chat field's name in a 400 -> the Ollama field it came from (by prefix).
_PARAMS = (("max_tokens", "options.num_predict"), ("repetition_penalty", "options.repeat_penalty"),
           ("response_format", "format"), ("structured_outputs.json_object", "format"),
           ("structured_outputs.json", "format"), ("chat_template_kwargs", "think"))
_OPTIONS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty", "frequency_penalty")


def chat_body(body: OllamaChatBody, served: tuple[str, ...]) -> dict[str, Any]:
    chat = {**_sampling(body, served), **_shaping(body, as_completion=False)}
    chat["messages"] = _messages(body.messages)
    if ends_in_prefill(chat["messages"]):  # as Ollama's templates leave the last assistant turn open
        chat.update(PREFILL)
    if body.tools:
        chat["tools"] = [{"type": "function", "function": t.function.model_dump(exclude_none=True)}
                         for t in body.tools]
    return chat


def generate_body(body: OllamaGenerateBody, served: tuple[str, ...]) -> dict[str, Any]:
    """A chat body, or with `raw` or a `suffix` a completion body (images, template and context: the schema's
    checks). A suffix asks for the text between the prompt and it, as Ollama's code models' templates do."""
    # With no prompt there is nothing to complete: a load request, checked as the chat it would be.
    completion = bool(body.prompt) and (body.raw or bool(body.suffix))
    request = {**_sampling(body, served), **_shaping(body, as_completion=completion)}
    if completion:
        if body.logprobs:  # the completions API's form: logprobs is the number of alternatives
            request["logprobs"] = request.pop("top_logprobs", 0)
        request["prompt"] = body.prompt
        if body.suffix:
            request["suffix"] = body.suffix
        return request
    request["messages"] = ([{"role": "system", "content": body.system}] if body.system else []) + \
        [{"role": "user", "content": body.prompt}]
    return request


def ollama_names() -> contextlib.AbstractContextManager[None]:
    """A 400 from the chat checks, naming the Ollama field."""
    return params_renamed(_ollama_param)


def _sampling(body: OllamaChatBody | OllamaGenerateBody, served: tuple[str, ...]) -> dict[str, Any]:
    request: dict[str, Any] = {"model": without_default_tag(body.model, served), "stream": body.stream}
    options = body.options
    if options is not None:
        if options.num_predict is not None and options.num_predict > 0:
            request["max_tokens"] = options.num_predict
        for name in _OPTIONS:
            if getattr(options, name) is not None:
                request[name] = getattr(options, name)
        if options.repeat_penalty is not None:
            request["repetition_penalty"] = options.repeat_penalty
    if body.logprobs:
        request["logprobs"] = True
        if body.top_logprobs:
            request["top_logprobs"] = body.top_logprobs
    return request


def _shaping(body: OllamaChatBody | OllamaGenerateBody, as_completion: bool) -> dict[str, Any]:
    """`format` and `think` as the request's fields: a chat's response_format and template switch, or a
    completion's structured_outputs (vLLM's; a completion has no template to switch)."""
    fields: dict[str, Any] = {}
    if body.format == "json":
        fields = {"structured_outputs": {"json_object": True}} if as_completion else {
            "response_format": {"type": "json_object"}}
    elif isinstance(body.format, dict):
        fields = {"structured_outputs": {"json": body.format}} if as_completion else {
            "response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": body.format}}}
    if body.think is not None and not as_completion:
        fields["chat_template_kwargs"] = {"enable_thinking": body.think is not False}
    return fields


def _messages(messages: list[OllamaMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (call id, tool name) of the calls no tool message has answered yet
    for i, message in enumerate(messages):
        entry: dict[str, Any] = {"role": message.role, "content": message.content or ""}
        if message.role == "assistant" and message.tool_calls:
            calls = []
            for k, call in enumerate(message.tool_calls):
                call_id = call.id or f"call_{i}_{k}"
                unanswered.append((call_id, call.function.name))
                calls.append({"id": call_id, "type": "function", "function": {
                    "name": call.function.name, "arguments": json.dumps(call.function.arguments, ensure_ascii=False)}})
            entry["tool_calls"] = calls
            entry["content"] = message.content or None
        elif message.role == "tool":
            entry["tool_call_id"] = message.tool_call_id or _answer(unanswered, message.tool_name, i)
        out.append(entry)
    return out


def _answer(unanswered: list[tuple[str, str]], tool_name: str | None, index: int) -> str:
    for k, (call_id, name) in enumerate(unanswered):
        if tool_name is None or name == tool_name:
            del unanswered[k]
            return call_id
    return f"call_result_{index}"  # a result with no call before it: the template shows it as it is


def _ollama_param(param: str) -> str:
    for chat_name, name in _PARAMS:
        if param == chat_name or param.startswith(chat_name + ".") or param.startswith(chat_name + "["):
            return name + param[len(chat_name):]
    if param in _OPTIONS or param.split(".", 1)[0].split("[", 1)[0] in _OPTIONS:
        return "options." + param
    return param

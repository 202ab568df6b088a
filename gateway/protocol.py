"""Validation of OpenAI request bodies into typed requests.

Every field is checked for type and range here, before anything reaches a worker; a field we do not
know or do not support is a 400 that names it (a silently ignored `tools` or `response_format` would
give a client answers it did not ask for).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from gateway.errors import ApiError, invalid
from gateway.structured_output import ResponseFormat, parse_response_format
from gateway.tools import ToolSpec, parse_tools
from shared.sampling_params import MAX_LOGPROBS, SamplingParams, SamplingParamsError


@dataclass(frozen=True)
class Limits:
    max_n: int = 16
    max_stop: int = 16  # stop strings per request
    max_stop_length: int = 512  # characters per stop string


@dataclass(frozen=True)
class CommonFields:
    model: str
    params: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class CompletionRequest(CommonFields):
    prompts: tuple[str | tuple[int, ...], ...]  # text, or token ids
    echo: bool
    prompt_logprobs: int | None  # vLLM's extension, as asked (params.prompt_logprobs also covers echo)


@dataclass(frozen=True)
class ChatRequest(CommonFields):
    # role, content (text parts joined), and name when given; tool_calls (arguments parsed into objects,
    # as templates expect them) on assistant turns, tool_call_id on tool results
    messages: tuple[dict[str, Any], ...]
    template_kwargs: dict[str, Any]
    top_logprobs: int | None  # None: logprobs not asked for
    prompt_logprobs: int | None  # vLLM's extension
    tools: ToolSpec | None = None  # None: no tools declared
    response_format: ResponseFormat | None = None  # None: text


# Fields OpenAI defines that MILI does not implement, and the values that mean "not used".
_UNSUPPORTED = {
    "best_of": (None, 1), "suffix": (None, ""), "functions": (None, []), "function_call": (None, "none"), "audio": (None,), "prediction": (None,),
    "modalities": (None, ["text"]), "web_search_options": (None,), "reasoning_effort": (None,),
}
_IGNORED = ("user", "store", "metadata", "service_tier")  # accepted, no effect


class _Body:
    """Typed access to a JSON object that remembers which fields were read, so the rest can be refused."""

    def __init__(self, body: Any):
        if not isinstance(body, dict):
            raise invalid("the request body must be a JSON object")
        self.body = body
        self.read: set[str] = set()

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        self.read.add(name)
        value = self.body.get(name)
        if value is None:
            return default
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if not ok and float in kinds and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not ok:
            names = " or ".join({int: "an integer", float: "a number", str: "a string", bool: "a boolean",
                                 list: "an array", dict: "an object"}[k] for k in kinds)
            raise invalid(f"{name} must be {names}", name)
        return value

    def finish(self) -> None:
        for name, unused in _UNSUPPORTED.items():
            self.read.add(name)
            if name in self.body and self.body[name] not in unused:
                raise invalid(f"{name} is not supported by this server", name)
        self.read.update(_IGNORED)
        unknown = sorted(set(self.body) - self.read)
        if unknown:
            raise invalid(f"unrecognized request argument: {unknown[0]}", unknown[0])


def parse_completion(raw: Any, limits: Limits) -> CompletionRequest:
    body = _Body(raw)
    prompts = _prompts(body.body.get("prompt"))
    body.read.add("prompt")
    logprobs = body.get("logprobs", int)
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise invalid(f"logprobs must be between 0 and {MAX_LOGPROBS}", "logprobs")
    max_tokens = body.get("max_tokens", int, 16)  # OpenAI's default for completions
    common = _common(body, limits, max_tokens, logprobs)
    echo = body.get("echo", bool, False)
    if max_tokens == 0 and not echo:
        # As vLLM: generating nothing only makes sense to score the prompt, which echo returns.
        raise invalid("max_tokens must be at least 1; 0 is allowed only with echo, to score the prompt",
                      "max_tokens")
    prompt_logprobs = _prompt_logprobs(body, common["stream"])
    # echo + logprobs scores the prompt too, with the same number of alternatives.
    wanted = [k for k in (prompt_logprobs, logprobs if echo else None) if k is not None]
    if wanted:
        common["params"] = dataclasses.replace(common["params"], prompt_logprobs=max(wanted))
    body.finish()
    return CompletionRequest(**common, prompts=prompts, echo=echo, prompt_logprobs=prompt_logprobs)


def parse_chat(raw: Any, limits: Limits) -> ChatRequest:
    body = _Body(raw)
    messages = _messages(body.get("messages", list))
    want_logprobs = body.get("logprobs", bool, False)
    top = body.get("top_logprobs", int)
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise invalid(f"top_logprobs must be between 0 and {MAX_LOGPROBS}", "top_logprobs")
    if top is not None and not want_logprobs:
        raise invalid("top_logprobs requires logprobs to be true", "top_logprobs")
    max_tokens = body.get("max_completion_tokens", int)
    legacy = body.get("max_tokens", int)
    max_tokens = max_tokens if max_tokens is not None else legacy
    common = _common(body, limits, max_tokens, (top or 0) if want_logprobs else None)
    if max_tokens == 0:
        param = "max_completion_tokens" if "max_completion_tokens" in body.body else "max_tokens"
        raise invalid(f"{param} must be at least 1", param)
    prompt_logprobs = _prompt_logprobs(body, common["stream"])
    if prompt_logprobs is not None:
        common["params"] = dataclasses.replace(common["params"], prompt_logprobs=prompt_logprobs)
    response_format = parse_response_format(body.get("response_format", dict))
    tools = parse_tools(body.get("tools", list), body.get("tool_choice", (str, dict)),
                        body.get("parallel_tool_calls", bool))
    kwargs = body.get("chat_template_kwargs", dict, {})
    body.finish()
    return ChatRequest(**common, messages=messages, template_kwargs=kwargs,
                       top_logprobs=(top or 0) if want_logprobs else None, prompt_logprobs=prompt_logprobs,
                       tools=tools, response_format=response_format)


def _common(body: _Body, limits: Limits, max_tokens: int | None, logprobs: int | None) -> dict[str, Any]:
    model = body.get("model", str)
    if model is None:
        raise invalid("model is required", "model")
    n = body.get("n", int, 1)
    if not 1 <= n <= limits.max_n:
        raise invalid(f"n must be between 1 and {limits.max_n}", "n")
    stop = body.get("stop", (str, list), [])
    stop = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) and s for s in stop):
        raise invalid("stop must be a non-empty string or an array of non-empty strings", "stop")
    if len(stop) > limits.max_stop:
        raise invalid(f"at most {limits.max_stop} stop strings are allowed, got {len(stop)}", "stop")
    if any(len(s) > limits.max_stop_length for s in stop):
        raise invalid(f"stop strings may be at most {limits.max_stop_length} characters long", "stop")
    stream = body.get("stream", bool, False)
    options = body.get("stream_options", dict)
    if options is not None and not stream:
        raise invalid("stream_options is only allowed when stream is true", "stream_options")
    include_usage = bool((options or {}).get("include_usage", False))
    bias = body.get("logit_bias", dict, {})
    try:
        logit_bias = {int(k): float(v) for k, v in bias.items()}
    except (TypeError, ValueError):
        raise invalid("logit_bias must map token ids to numbers", "logit_bias") from None
    stop_ids = body.get("stop_token_ids", list, [])
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise invalid("stop_token_ids must be an array of integers", "stop_token_ids")
    try:
        params = SamplingParams(
            n=n, max_tokens=max_tokens, temperature=body.get("temperature", float, 1.0),
            top_p=body.get("top_p", float, 1.0), top_k=body.get("top_k", int, 0), min_p=body.get("min_p", float, 0.0),
            presence_penalty=body.get("presence_penalty", float, 0.0),
            frequency_penalty=body.get("frequency_penalty", float, 0.0),
            repetition_penalty=body.get("repetition_penalty", float, 1.0), logit_bias=logit_bias,
            min_tokens=body.get("min_tokens", int, 0), ignore_eos=body.get("ignore_eos", bool, False),
            stop_token_ids=tuple(stop_ids), seed=body.get("seed", int), logprobs=logprobs)
    except SamplingParamsError as e:
        param = "max_completion_tokens" if e.param == "max_tokens" and "max_completion_tokens" in body.body else e.param
        raise invalid(str(e), param) from None
    return dict(model=model, params=params, stop=tuple(stop), stream=stream, include_usage=include_usage)


def _prompt_logprobs(body: _Body, stream: bool) -> int | None:
    k = body.get("prompt_logprobs", int)
    if k is not None and not 0 <= k <= MAX_LOGPROBS:
        raise invalid(f"prompt_logprobs must be between 0 and {MAX_LOGPROBS}", "prompt_logprobs")
    if k is not None and stream:  # as vLLM: they would come before any token, and no chunk has a place for them
        raise invalid("prompt_logprobs is not available when stream is true", "prompt_logprobs")
    return k


def _prompts(prompt: Any) -> tuple[str | tuple[int, ...], ...]:
    def is_ids(x: Any) -> bool:
        return isinstance(x, list) and bool(x) and all(isinstance(t, int) and not isinstance(t, bool) for t in x)

    if isinstance(prompt, str):
        items: list = [prompt]
    elif is_ids(prompt):
        items = [tuple(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        items = list(prompt)
    elif isinstance(prompt, list) and prompt and all(is_ids(p) for p in prompt):
        items = [tuple(p) for p in prompt]
    else:
        raise invalid("prompt must be a string, an array of strings, an array of token ids or an array of "
                      "token-id arrays, and not empty", "prompt")
    if any(p == "" for p in items):
        raise invalid("prompt must not be empty", "prompt")
    return tuple(items)


_ROLES = ("system", "developer", "user", "assistant", "tool")
# What clients send back with an assistant message taken from a response; none of it reaches the template.
_ASSISTANT_ECHO = ("refusal", "reasoning_content", "function_call", "audio", "annotations")


def _messages(messages: list | None) -> tuple[dict[str, Any], ...]:
    if not messages:
        raise invalid("messages must be a non-empty array", "messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(f"{where} must be an object", where)
        role = message.get("role")
        if role not in _ROLES:
            raise invalid(f"{where}.role must be one of {', '.join(_ROLES)}", f"{where}.role")
        allowed = {"role", "content", "name"}
        allowed |= {"tool_calls", *_ASSISTANT_ECHO} if role == "assistant" else set()
        allowed |= {"tool_call_id"} if role == "tool" else set()
        unknown = sorted(set(message) - allowed)
        if unknown:
            raise invalid(f"{where}.{unknown[0]} is not supported", f"{where}.{unknown[0]}")
        entry: dict[str, Any] = {"role": "system" if role == "developer" else role}
        calls = message.get("tool_calls")
        if role == "assistant" and calls:
            entry["tool_calls"] = _tool_calls(calls, f"{where}.tool_calls")
            entry["content"] = None if message.get("content") is None else _content(message["content"], where)
        else:
            entry["content"] = _content(message.get("content"), where)
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise invalid(f"{where}.tool_call_id must be a string", f"{where}.tool_call_id")
            entry["tool_call_id"] = call_id
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        out.append(entry)
    return tuple(out)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant turn's calls as templates read them (transformers' convention): arguments as an object."""
    if not isinstance(calls, list):
        raise invalid(f"{where} must be an array", where)
    out = []
    for j, call in enumerate(calls):
        at = f"{where}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(fn.get("arguments"), str)
                and call.get("type", "function") == "function"):
            raise invalid(f"{at} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}} "
                          "with name and arguments strings", at)
        try:
            arguments = json.loads(fn["arguments"])
        except ValueError:
            raise invalid(f"{at}.function.arguments is not valid JSON", f"{at}.function.arguments") from None
        out.append({"id": call.get("id") if isinstance(call.get("id"), str) else "", "type": "function",
                    "function": {"name": fn["name"], "arguments": arguments}})
    return out


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise invalid(f"{where}.content[{j}]: only text parts are supported", f"{where}.content")
            texts.append(part["text"])
        return "\n".join(texts)  # as vLLM joins text parts
    raise invalid(f"{where}.content must be a string or an array of text parts", f"{where}.content")


def require_model(request: CommonFields, served_name: str) -> None:
    if request.model != served_name:
        raise ApiError(404, f"the model {request.model!r} does not exist; this server serves {served_name!r}",
                       "model", "model_not_found")

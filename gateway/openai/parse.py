"""OpenAI request bodies into the typed requests the gateway serves.

A body is validated against its model (gateway/openai/schema.py: types, ranges, shapes, unknown fields);
then the checks no schema can hold run here (the server's limits, the rules between fields), before
anything reaches a worker. A field we do not know or do not support is a 400 that names it (a silently
ignored `tools` or `response_format` would give a client answers it did not ask for).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.openai import schema
from gateway.openai.schema import CHAT_UNSUPPORTED, ChatBody, CompletionBody
from gateway.openai.validation import validate as _validate
from gateway.server.errors import ApiError, invalid
from gateway.text.grammars import ResponseFormat, parse_response_format
from gateway.text.output_constraints import OutputConstraint, parse_output_constraint
from gateway.text.reasoning_effort import effort_template_kwargs
from gateway.text.tool_specs import ToolSpec, parse_tools
from shared.request_limits import (COMPLETION_MAX_TOKENS_DEFAULT, DEFAULT_MAX_N, DEFAULT_MAX_STOP,
                                   DEFAULT_MAX_STOP_LENGTH, N)
from shared.sampling_params import SamplingParams, SamplingParamsError


@dataclass(frozen=True)
class Limits:
    """The server's own bounds (--max-n, --max-stop-strings, --max-stop-length)."""

    max_n: int = DEFAULT_MAX_N  # within shared/request_limits.py's N, which SamplingParams checks
    max_stop: int = DEFAULT_MAX_STOP  # stop strings per request
    max_stop_length: int = DEFAULT_MAX_STOP_LENGTH  # characters per stop string
    priorities: bool = False  # --scheduling-policy priority: requests may carry a priority other than 0

    def __post_init__(self) -> None:
        if not N.contains(self.max_n):
            raise ValueError(f"max n must be between {N.lo} and {N.hi}, got {self.max_n}")


@dataclass(frozen=True)
class CommonFields:
    model: str
    params: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    continuous_usage: bool  # vLLM's continuous_usage_stats (with include_usage): usage on every chunk
    skip_special_tokens: bool  # vLLM's: false writes the special tokens the model samples into the text
    include_stop: bool  # vLLM's include_stop_str_in_output: the text keeps the stop string that ended it
    return_token_ids: bool  # vLLM's: prompt_token_ids and each choice's generated token_ids in the answer
    bad_words: tuple[str, ...]  # vLLM's: tokenized at admission (gateway/text/bad_words.py)
    truncate_prompt_tokens: int | None  # vLLM's: keep the prompt's last N tokens (-1: the context length)


@dataclass(frozen=True)
class CompletionRequest(CommonFields):
    prompts: tuple[str | tuple[int, ...], ...]  # text, or token ids
    echo: bool
    prompt_logprobs: int | None  # vLLM's extension, as asked (params.prompt_logprobs also covers echo)
    response_format: ResponseFormat | None = None  # vLLM's, as chat's; None: text
    constraint: OutputConstraint | None = None  # beyond response_format (never with it); None: unconstrained
    suffix: str | None = None  # fill in the middle: the text after what is generated (gateway/text/fill_in_middle.py)


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
    constraint: OutputConstraint | None = None  # beyond response_format (never with it, nor with tool calls)
    thinking_budget: int | None = None  # the most reasoning tokens (Anthropic's thinking.budget_tokens); None: no bound
    add_generation_prompt: bool = True  # the prompt ends by opening the assistant's turn
    continue_final_message: bool = False  # the last message (an assistant's text) is continued: a prefill


def parse_completion(raw: Any, limits: Limits,
                     default_max_tokens: int | None = COMPLETION_MAX_TOKENS_DEFAULT) -> CompletionRequest:
    """default_max_tokens: what a body without max_tokens generates at most (None: up to the end of the context,
    llama.cpp's n_predict -1)."""
    body = _validate(CompletionBody, raw)
    max_tokens = default_max_tokens if body.max_tokens is None else body.max_tokens
    common = _common(body, limits, max_tokens, body.logprobs)
    echo = bool(body.echo)
    if max_tokens == 0 and not echo:
        # As vLLM: generating nothing only makes sense to score the prompt, which echo returns.
        raise invalid("max_tokens must be at least 1; 0 is allowed only with echo, to score the prompt",
                      "max_tokens")
    prompt_logprobs = _prompt_logprobs(body.prompt_logprobs, common["stream"])
    if body.suffix and echo:  # as OpenAI's: the prompt echoed would not be the text before the suffix's answer
        raise invalid("echo is not available with suffix", "echo")
    prompts = _prompts(body.prompt)
    if body.suffix and not all(isinstance(p, str) for p in prompts):
        raise invalid("suffix is served with text prompts, not token ids", "prompt")
    # echo + logprobs scores the prompt too, with the same number of alternatives.
    wanted = [k for k in (prompt_logprobs, body.logprobs if echo else None) if k is not None]
    if wanted:
        common["params"] = dataclasses.replace(common["params"], prompt_logprobs=max(wanted))
    response_format = parse_response_format(raw.get("response_format"))
    constraint = parse_output_constraint(raw, ("response_format",) if response_format is not None else ())
    return CompletionRequest(**common, prompts=prompts, echo=echo, prompt_logprobs=prompt_logprobs,
                             response_format=response_format, constraint=constraint, suffix=body.suffix or None)


def check_priority(priority: int | None, limits: Limits) -> None:
    """As vLLM: a priority the scheduler would ignore (first come, first served) is refused."""
    if priority and not limits.priorities:
        raise invalid("priority is served only with --scheduling-policy priority; this server schedules first come, "
                      "first served (send 0 or leave it out)", "priority")


def parse_chat(raw: Any, limits: Limits) -> ChatRequest:
    body = _validate(ChatBody, raw, CHAT_UNSUPPORTED)
    top = body.top_logprobs
    if top is not None and not body.logprobs:
        raise invalid("top_logprobs requires logprobs to be true", "top_logprobs")
    logprobs = (top or 0) if body.logprobs else None
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    common = _common(body, limits, max_tokens, logprobs, "max_completion_tokens" in raw)
    prompt_logprobs = _prompt_logprobs(body.prompt_logprobs, common["stream"])
    if prompt_logprobs is not None:
        common["params"] = dataclasses.replace(common["params"], prompt_logprobs=prompt_logprobs)
    # The shapes are valid here; these check what a schema cannot (names declared twice, schema sizes).
    response_format = parse_response_format(raw.get("response_format"))
    tools = parse_tools(raw.get("tools"), raw.get("tool_choice"), raw.get("parallel_tool_calls"))
    others = (("response_format",) if response_format is not None else ()) + (
        ("tools",) if tools is not None and tools.calls_possible else ())
    constraint = parse_output_constraint(raw, others)
    messages = tuple(map(_message, body.messages))
    if body.continue_final_message:
        _check_continuable(body, messages)
    return ChatRequest(**common, messages=messages,
                       template_kwargs={**effort_template_kwargs(body.reasoning_effort),
                                        **(body.chat_template_kwargs or {})}, top_logprobs=logprobs,
                       prompt_logprobs=prompt_logprobs, tools=tools, response_format=response_format,
                       constraint=constraint, add_generation_prompt=body.add_generation_prompt is not False,
                       continue_final_message=bool(body.continue_final_message))


def ends_in_prefill(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether a conversation (chat messages as _message makes them, or Anthropic's and Ollama's translated) ends
    with an assistant's text that can be continued: a prefill (chat's continue_final_message)."""
    return final_assistant_text(messages).strip() != ""


def final_assistant_text(messages: Sequence[dict[str, Any]]) -> str:
    """The text of the final message when it is an assistant's without tool calls; "" otherwise."""
    final = messages[-1] if messages else None
    if final is None or final["role"] != "assistant" or final.get("tool_calls"):
        return ""
    return final["content"] or ""


PREFILL = {"continue_final_message": True, "add_generation_prompt": False}  # chat's fields for a prefill


def _check_continuable(body: ChatBody, messages: Sequence[dict[str, Any]]) -> None:
    """What continuing the final message needs (as vLLM checks it): no new turn opened, and an assistant's text
    last."""
    if body.add_generation_prompt is not False:
        raise invalid("continue_final_message needs add_generation_prompt: false", "add_generation_prompt")
    if not ends_in_prefill(messages):
        raise invalid("continue_final_message needs the last message to be an assistant's text, without tool_calls",
                      f"messages[{len(body.messages) - 1}]")


def _common(body: schema.CommonBody, limits: Limits, max_tokens: int | None, logprobs: int | None,
            max_tokens_named_completion: bool = False) -> dict[str, Any]:
    n = 1 if body.n is None else body.n
    if n > limits.max_n:
        raise invalid(f"n must be between {N.lo} and {limits.max_n}", "n")
    stop = [body.stop] if isinstance(body.stop, str) else (body.stop or [])
    if len(stop) > limits.max_stop:
        raise invalid(f"at most {limits.max_stop} stop strings are allowed, got {len(stop)}", "stop")
    if any(len(s) > limits.max_stop_length for s in stop):
        raise invalid(f"stop strings may be at most {limits.max_stop_length} characters long", "stop")
    stream = bool(body.stream)
    if body.stream_options is not None and not stream:
        raise invalid("stream_options is only allowed when stream is true", "stream_options")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    continuous_usage = include_usage and bool(body.stream_options.continuous_usage_stats)
    check_priority(body.priority, limits)
    # A field the body leaves out takes SamplingParams' default.
    given = {name: getattr(body, name) for name in _SAMPLING_FIELDS if getattr(body, name) is not None}
    try:
        params = SamplingParams(
            **given, n=n, max_tokens=max_tokens, logit_bias={int(k): v for k, v in (body.logit_bias or {}).items()},
            ignore_eos=bool(body.ignore_eos), stop_token_ids=tuple(body.stop_token_ids or ()), seed=body.seed,
            logprobs=logprobs, allowed_token_ids=body.allowed_token_ids)
    except SamplingParamsError as e:
        param = "max_completion_tokens" if e.param == "max_tokens" and max_tokens_named_completion else e.param
        raise invalid(str(e), param) from None
    return dict(model=body.model, params=params, stop=tuple(stop), stream=stream, include_usage=include_usage,
                continuous_usage=continuous_usage, skip_special_tokens=body.skip_special_tokens is not False,
                include_stop=bool(body.include_stop_str_in_output), return_token_ids=bool(body.return_token_ids),
                bad_words=tuple(body.bad_words or ()), truncate_prompt_tokens=body.truncate_prompt_tokens)


# The body's fields that SamplingParams takes as they are.
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                    "repetition_penalty", "min_tokens", "priority")


def _prompt_logprobs(k: int | None, stream: bool) -> int | None:
    if k is not None and stream:  # as vLLM: they would come before any token, and no chunk has a place for them
        raise invalid("prompt_logprobs is not available when stream is true", "prompt_logprobs")
    return k


def _prompts(prompt: str | list) -> tuple[str | tuple[int, ...], ...]:
    """The validated prompt field as a tuple of prompts: texts, or token-id tuples."""
    if isinstance(prompt, str):
        return (prompt,)
    if isinstance(prompt[0], str):
        return tuple(prompt)
    if isinstance(prompt[0], int):
        return (tuple(prompt),)
    return tuple(tuple(p) for p in prompt)


def _message(message: schema.Message) -> dict[str, Any]:
    """A message as chat templates read it: role (developer as system), content (text parts joined; a missing
    content is "", as vLLM renders it), and name when given; tool_calls (arguments parsed into values,
    transformers' convention) on assistant turns, tool_call_id on tool results. An SDK hands a tool-call turn
    back with `content: null`, and templates read content as a string (Qwen3's does `'</think>' in
    message.content`), so null never reaches a template."""
    entry: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role}
    calls = getattr(message, "tool_calls", None)
    if calls:
        entry["tool_calls"] = [{"id": c.id or "", "type": "function",
                                "function": {"name": c.function.name, "arguments": json.loads(c.function.arguments)}}
                               for c in calls]
    entry["content"] = _content(message.content)
    if message.role == "tool":
        entry["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        entry["name"] = message.name
    return entry


def _content(content: str | list | None) -> str:
    if content is None:  # an assistant turn with calls only, or with neither text nor calls
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)  # as vLLM joins text parts


def require_model(model: str, served: tuple[str, ...]) -> None:
    """`served`: the --served-model-name names, any of which a request may ask for (answers carry the one asked for;
    metrics and /health the first)."""
    if model not in served:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves {served_names_text(served)}",
                       "model", "model_not_found")


def served_names_text(served: tuple[str, ...]) -> str:
    also = f" (also named {', '.join(map(repr, served[1:]))})" if len(served) > 1 else ""
    return f"{served[0]!r}{also}"


# Ollama's default tag: its clients name an untagged model `name:latest`.
DEFAULT_TAG = ":latest"


def with_default_tag(name: str) -> str:
    """The name as Ollama lists a model: tagged, `:latest` where it has no tag of its own."""
    return name if ":" in name else name + DEFAULT_TAG


def without_default_tag(model: str, served: tuple[str, ...]) -> str:
    """The name a request's model means: a served name's default-tagged spelling is that name."""
    if model in served:
        return model
    return next((name for name in served if model == with_default_tag(name)), model)

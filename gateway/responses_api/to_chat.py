"""A Responses API request as the Chat Completions request it means, so both endpoints share one set of checks
(limits, tools, formats, context length) and one path to the worker.

The translation: `instructions` is a system message ahead of the input; the input's messages keep their roles
(developer as system); function calls sent back join the assistant turn before them as its tool_calls, and
their outputs become tool messages; reasoning items are dropped (templates drop earlier turns' reasoning).
Flat function tools and `tool_choice` take chat's nested shapes (a namespace's functions are offered beside the
others; a hosted web search tool is not offered); `text.format` becomes `response_format`;
`max_output_tokens` is max_completion_tokens. A 400 from the chat checks names the Responses field.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gateway.openai.parse import ChatRequest, Limits, parse_chat
from gateway.openai.validation import validate
from gateway.responses_api.schema import (LOGPROBS, UNSUPPORTED, FunctionCallItem, FunctionCallOutputItem, FunctionTool,
                                          MessageItem, NamespaceTool, ReasoningItem, ResponsesBody, Tool, item_kind)
from gateway.server.errors import ApiError, invalid

# A chat field's name in a 400 -> the Responses field it came from (by prefix).
_PARAMS = (("messages", "input"), ("max_completion_tokens", "max_output_tokens"), ("max_tokens", "max_output_tokens"),
           ("response_format.json_schema.schema", "text.format.schema"), ("response_format", "text.format"),
           ("tool_choice.function.name", "tool_choice.name"), ("logprobs", "include"),
           ("reasoning_effort", "reasoning.effort"))


@dataclass(frozen=True)
class ResponsesRequest:
    body: ResponsesBody  # as sent, its input after the earlier turns' (the response echoes its settings)
    chat: ChatRequest  # what runs
    input_items: list[dict[str, Any]]  # the conversation's items: the earlier turns', then this request's input
    store: bool  # whether the response is kept (gateway/responses_api/store.py)


def parse_responses(raw: Any, limits: Limits, earlier: list[dict[str, Any]] | None = None,
                    can_store: bool = False) -> ResponsesRequest:
    """`earlier`: the items of the conversation `previous_response_id` continues (its turns come before the input).
    `can_store`: the server keeps responses, so `store` (default true) is honoured."""
    body = validate(ResponsesBody, raw, UNSUPPORTED, tagged={"input": item_kind})  # errors name the sent items
    items = input_items(raw["input"])
    if earlier:  # the stored items were valid when stored; validated again with the new ones as one input
        items = earlier + items
        body = validate(ResponsesBody, {**raw, "input": items}, UNSUPPORTED, tagged={"input": item_kind})
    with responses_names():
        chat = parse_chat(chat_body(body), limits)
    return ResponsesRequest(body, chat, items, can_store and body.store is not False)


def input_items(value: str | list) -> list[dict[str, Any]]:
    """A valid `input` as a list of items: text is one user message."""
    return [{"type": "message", "role": "user", "content": value}] if isinstance(value, str) else list(value)


@contextlib.contextmanager
def responses_names() -> Iterator[None]:
    """A 400 from the chat checks, naming the Responses field (in `param` and in the message)."""
    try:
        yield
    except ApiError as e:
        renamed = _responses_param(e.param)
        if renamed != e.param and e.param is not None:
            e.message = e.message.replace(e.param.split(".")[0].split("[")[0], renamed.split(".")[0].split("[")[0])
            e.param = renamed
        raise


def chat_body(body: ResponsesBody) -> dict[str, Any]:
    chat: dict[str, Any] = {"model": body.model, "messages": _messages(body), "stream": bool(body.stream)}
    for name in ("temperature", "top_p", "parallel_tool_calls", "seed", "top_k", "min_p", "repetition_penalty",
                 "ignore_eos", "chat_template_kwargs", "priority"):
        value = getattr(body, name)
        if value is not None:
            chat[name] = value
    if body.reasoning is not None and body.reasoning.effort is not None:
        chat["reasoning_effort"] = body.reasoning.effort
    if LOGPROBS in (body.include or ()):
        chat["logprobs"] = True
        chat["top_logprobs"] = body.top_logprobs or 0
    if body.max_output_tokens is not None:
        chat["max_completion_tokens"] = body.max_output_tokens
    functions = offered_functions(body.tools or [])
    if body.tools is not None and (functions or not body.tools):  # hosted tools alone: the model is offered none
        chat["tools"] = [{"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
                         for tool, _ in functions]
    if body.tool_choice is not None:
        choice = body.tool_choice
        chat["tool_choice"] = choice if isinstance(choice, str) else {"type": "function",
                                                                      "function": {"name": choice.name}}
    text_format = body.text.format if body.text is not None else None
    if text_format is not None:
        if text_format.type == "json_schema":
            spec = text_format.model_dump(exclude={"type"}, exclude_none=True, by_alias=True)
            chat["response_format"] = {"type": "json_schema", "json_schema": spec}
        else:
            chat["response_format"] = {"type": text_format.type}
    return chat


def offered_functions(tools: list[Tool]) -> list[tuple[FunctionTool, str | None]]:
    """The functions the model is offered, each with the namespace it was declared in (None: at the top level).
    The model sees plain names, so a name declared twice, in namespaces or not, is a 400."""
    functions: list[tuple[FunctionTool, str | None]] = []
    for tool in tools:
        if isinstance(tool, FunctionTool):
            functions.append((tool, None))
        elif isinstance(tool, NamespaceTool):
            functions += [(inner, tool.name) for inner in tool.tools]
    seen: dict[str, str | None] = {}
    for tool, namespace in functions:
        if tool.name in seen:
            where = [f"namespace {ns!r}" if ns else "the top level" for ns in (seen[tool.name], namespace)]
            raise invalid(f"tool {tool.name!r} is declared twice ({where[0]} and {where[1]}): the model calls "
                          "functions by name", "tools")
        seen[tool.name] = namespace
    return functions


def function_namespaces(tools: list[Tool]) -> dict[str, str]:
    """Function name -> the namespace it was declared in, for the functions declared in one."""
    return {tool.name: namespace for tool, namespace in offered_functions(tools) if namespace is not None}


def _messages(body: ResponsesBody) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.instructions is not None:
        messages.append({"role": "system", "content": body.instructions})
    items = [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    for item in items:
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": _text(item.content)})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the same turn: its text, then its calls
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
        else:
            assert isinstance(item, ReasoningItem)
    if not messages:
        raise invalid("input has only reasoning items: there is no turn to answer", "input")
    return messages


def _text(content: str | list) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(part.refusal if part.type == "refusal" else part.text for part in content)


def _responses_param(param: str | None) -> str | None:
    if param is None:
        return None
    for chat_name, name in _PARAMS:
        if chat_name == "messages" and (param == chat_name or param.startswith(chat_name + "[")):
            return name  # the indices differ: instructions come first, calls join the turn before them
        if param == chat_name or param.startswith(chat_name + ".") or param.startswith(chat_name + "["):
            return name + param[len(chat_name):]
    if param.startswith("tools[") and ".function." in param:
        return param.replace(".function.", ".", 1)
    return param

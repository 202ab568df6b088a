"""A Messages API request as the Chat Completions request it means, so both share one set of checks (limits,
tools, context length), one grammar path and one path to the worker.

The translation:
- `system` (a string, or text blocks joined by blank lines) is the first system message; a `role: "system"`
  message stays where it is. Claude Code's per-request `x-anthropic-billing-header` block is dropped, as vLLM
  and llama.cpp do: it changes every request, so no prompt would ever reuse the cached prefix.
- A user turn's `tool_result` blocks become tool messages (an `is_error` result's text starts with "Error: ");
  its text blocks, the user message after them. An assistant turn's text is its content and its `tool_use`
  blocks its tool_calls; `thinking` and `redacted_thinking` blocks are dropped (templates drop earlier turns'
  reasoning). A plain-text or content `document` block (in a user turn or a tool result) is read as text where it
  stands: its title, its context and its text, each on its own paragraph; citations cannot be turned on (the
  response has no citation blocks). A `search_result` block is read the same way: its title, its source and its
  text. Image blocks and PDF, URL or file documents are a 400: the served model reads text only.
- `tools` are function tools with `input_schema` as parameters; `tool_choice` auto/any/tool/none is
  auto/required/named/none, and `disable_parallel_tool_use` is parallel_tool_calls false (auto: at most one
  call; any and tool: exactly one).
- `thinking` enabled/adaptive/disabled sets the template's `enable_thinking`; a budget is the chat request's
  `thinking_budget`, which the grammar enforces (gateway/text/grammars.py).
- A final assistant turn with text (and no tool_use) is a prefill: the prompt ends with that text, its turn left
  open (chat's continue_final_message), and the response holds what follows it. As Anthropic's API, its text may
  not end with whitespace.
- `output_config.format` (or the structured-outputs beta's `output_format`; the first wins), a JSON schema, is
  chat's strict `json_schema` response format: the text block is JSON that follows it, as the SDK's
  `messages.parse` reads it. `output_config.effort` is accepted with no effect (thinking is `thinking`'s to set).
- `max_tokens`, `stop_sequences` (stop), `temperature`, `top_p`, `top_k` map across as they are.
A 400 from the chat checks names the Messages field it came from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from gateway.anthropic.schema import (ContentSource, CountTokensBody, DocumentBlock, InputMessage, JsonOutputFormat,
                                      MessagesBody, RedactedThinkingBlock, RefusedBlock, RefusedSource,
                                      SearchResultBlock, TextBlock, ThinkingBlock, ThinkingEnabled, ToolResultBlock,
                                      ToolUseBlock, block_type)
from gateway.openai.parse import PREFILL, ChatRequest, Limits, ends_in_prefill, final_assistant_text, parse_chat
from gateway.openai.validation import validate
from gateway.server.errors import ApiError, invalid, params_renamed

BILLING_HEADER = "x-anthropic-billing-header:"
# The discriminated unions of the body (field -> its tag), for naming the field of a problem inside one.
_TAGGED = {"content": block_type, "system": block_type, "tool_choice": block_type, "thinking": block_type}
# Clearer words than "Input should be ..." for the fields that take one of several shapes.
_SHAPES = {
    "content": "must be a string or an array of content blocks (text, document, search_result, tool_use, "
               "tool_result, thinking)",
    "system": "must be a string or an array of text blocks",
    "tool_choice": "must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"tool\", \"name\": ...} or "
                   "{\"type\": \"none\"}",
    "thinking": "must be {\"type\": \"enabled\", \"budget_tokens\": N}, {\"type\": \"adaptive\"} or "
                "{\"type\": \"disabled\"}",
}
# A chat field's name in a 400 -> the Messages field it came from (by prefix).
_PARAMS = (("stop", "stop_sequences"), ("max_completion_tokens", "max_tokens"),
           ("tool_choice.function.name", "tool_choice.name"), ("parallel_tool_calls", "tool_choice"))


@dataclass(frozen=True)
class MessagesRequest:
    body: MessagesBody | CountTokensBody  # as sent
    chat: ChatRequest  # what runs (for count_tokens: what would run)


def parse_messages(raw: Any, limits: Limits, count_only: bool = False) -> MessagesRequest:
    """A /v1/messages body, or with `count_only` a /v1/messages/count_tokens body (no max_tokens)."""
    body = validate(CountTokensBody if count_only else MessagesBody, raw, (), tagged=_TAGGED, shapes=_SHAPES)
    translated = chat_body(body)  # its own 400s name the Messages field already
    with anthropic_names(body):
        chat = parse_chat(translated, limits)
    budget = body.thinking.budget_tokens if isinstance(body.thinking, ThinkingEnabled) else None
    return MessagesRequest(body, dataclasses.replace(chat, thinking_budget=budget))


def anthropic_names(body: MessagesBody | CountTokensBody) -> contextlib.AbstractContextManager[None]:
    """A 400 from the chat checks, naming the Messages field of `body`."""
    beta_only = isinstance(body, MessagesBody) and (body.output_config is None or body.output_config.format is None)
    output = "output_format" if beta_only else "output_config.format"
    return params_renamed(lambda param: _anthropic_param(param, output))


def chat_body(body: MessagesBody | CountTokensBody) -> dict[str, Any]:
    chat: dict[str, Any] = {"model": body.model, "messages": _messages(body)}
    prefill = final_assistant_text(chat["messages"])
    if prefill != prefill.rstrip():  # as Anthropic's API
        raise invalid("final assistant content cannot end with trailing whitespace",
                      f"messages[{len(body.messages) - 1}].content")
    if ends_in_prefill(chat["messages"]):  # the response continues it, and holds only what follows
        chat.update(PREFILL)
    if isinstance(body, MessagesBody):
        chat["max_tokens"] = body.max_tokens
        chat["stream"] = bool(body.stream)
        if body.stop_sequences:
            chat["stop"] = body.stop_sequences
        for name in ("temperature", "top_p", "top_k"):
            if getattr(body, name) is not None:
                chat[name] = getattr(body, name)
        output = _output_format(body)
        if output is not None:
            chat["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": output.schema_, "strict": True}}
    else:
        chat["max_tokens"] = 1  # counting only: nothing is generated
    if body.thinking is not None:
        chat["chat_template_kwargs"] = {"enable_thinking": body.thinking.type != "disabled"}
    if body.tools:
        chat["tools"] = [{"type": "function", "function": {
            "name": t.name, **({"description": t.description} if t.description is not None else {}),
            "parameters": t.input_schema, **({"strict": t.strict} if t.strict is not None else {})}}
            for t in body.tools]
    choice = body.tool_choice
    if choice is not None:
        if choice.type == "none":
            chat["tool_choice"] = "none"
        elif choice.type == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            chat["tool_choice"] = {"auto": "auto", "any": "required"}[choice.type]
        if choice.type != "none" and choice.disable_parallel_tool_use:
            chat["parallel_tool_calls"] = False
    return chat


def _output_format(body: MessagesBody) -> JsonOutputFormat | None:
    """output_config.format, else the beta's output_format (the GA name wins when both are sent)."""
    config = body.output_config.format if body.output_config is not None else None
    return config or body.output_format


def _messages(body: MessagesBody | CountTokensBody) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.system is not None:
        blocks = [body.system] if isinstance(body.system, str) else [b.text for b in body.system]
        system = "\n\n".join(b for b in blocks if not b.startswith(BILLING_HEADER))
        if system:
            messages.append({"role": "system", "content": system})
    for i, message in enumerate(body.messages):
        messages += _turn(message, f"messages[{i}]")
    return messages


def _turn(message: InputMessage, where: str) -> list[dict[str, Any]]:
    """One Messages turn as chat messages (a user turn with tool results is several)."""
    blocks = [TextBlock(type="text", text=message.content)] if isinstance(message.content, str) else message.content
    texts: list[tuple[str, bool]] = []  # (text, whether it is a document: a paragraph of its own)
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if isinstance(block, RefusedBlock):
            raise _not_text(block.type, at)
        if isinstance(block, (ThinkingBlock, RedactedThinkingBlock)):
            continue
        home = {"tool_result": "user", "document": "user", "search_result": "user",
                "tool_use": "assistant"}.get(block.type, message.role)
        if message.role != home:
            raise invalid(f"{at}.type: {block.type} blocks belong in {home} messages", f"{at}.type")
        if isinstance(block, TextBlock):
            texts.append((block.text, False))
        elif isinstance(block, (DocumentBlock, SearchResultBlock)):
            texts.append((_document_text(block, at), True))
        elif isinstance(block, ToolUseBlock):
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
        else:
            results.append({"role": "tool", "tool_call_id": block.tool_use_id,
                            "content": _result_text(block, f"{at}.content")})
    text = _joined(texts)
    if message.role == "assistant":
        return [{"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}]
    return results + ([{"role": message.role, "content": text}] if texts or not results else [])


def _joined(texts: list[tuple[str, bool]]) -> str:
    """A turn's text blocks one a line, as they were, with a blank line on each side of a document."""
    out = []
    for i, (text, document) in enumerate(texts):
        if i:
            out.append("\n\n" if document or texts[i - 1][1] else "\n")
        out.append(text)
    return "".join(out)


def _result_text(block: ToolResultBlock, where: str) -> str:
    text = _text_parts(block.content, where)
    return f"Error: {text}" if block.is_error else text


def _not_text(block_type: str, at: str) -> ApiError:
    return invalid(f"{at}.type: {block_type} blocks are not supported (this server serves a text-only model)",
                   f"{at}.type")


def _document_text(block: DocumentBlock | SearchResultBlock, where: str) -> str:
    """A text document as the model reads it: title, context and text, a paragraph each (a search result: title,
    source and text)."""
    if block.citations is not None and block.citations.enabled:
        raise invalid(f"{where}.citations: citations are not supported (the response has no citation blocks)",
                      f"{where}.citations")
    if isinstance(block, SearchResultBlock):
        return "\n\n".join(part for part in (block.title, block.source, "\n".join(b.text for b in block.content))
                           if part)
    source = block.source
    if isinstance(source, RefusedSource):
        raise invalid(f"{where}.source.type: {source.type} documents are not supported (this server serves a "
                      "text-only model; send the text as a text or content source)", f"{where}.source.type")
    if isinstance(source, ContentSource):
        body = _text_parts(source.content, f"{where}.source.content")
    else:
        body = source.data
    return "\n\n".join(part for part in (block.title, block.context, body) if part)


def _text_parts(content: str | list, where: str) -> str:
    """A content list's text blocks (and, in a tool result, documents) one a line; any other block is a 400."""
    if isinstance(content, str):
        return content
    parts = []
    for k, part in enumerate(content):
        if isinstance(part, RefusedBlock):
            raise _not_text(part.type, f"{where}[{k}]")
        parts.append(part.text if isinstance(part, TextBlock) else _document_text(part, f"{where}[{k}]"))
    return "\n".join(parts)


def _anthropic_param(param: str, output: str) -> str:
    """A chat field's name as the Messages field it came from; `output`: where the body's JSON schema was sent."""
    for chat_name, name in (*_PARAMS, ("response_format.json_schema", output), ("response_format", output)):
        if param == chat_name or param.startswith(chat_name + ".") or param.startswith(chat_name + "["):
            return name + param[len(chat_name):]
    if param.startswith("messages"):
        return "messages"  # the indices differ: system comes first, tool results are messages of their own
    if param.startswith("tools[") and ".function." in param:
        return param.replace(".function.parameters", ".input_schema").replace(".function.", ".", 1)
    return param

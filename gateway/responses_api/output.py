"""A Responses API response, built from a choice's events: its output items (reasoning, the message, function
calls, in the order the model produced them), and the typed stream events that build the same items.

One state machine serves both: a non-streamed response feeds every event and keeps the final object, a stream
sends the events as they are made. Stream events, in OpenAI's order: response.created and .in_progress; per item
output_item.added, then (message and reasoning) content_part.added, the text deltas, their .done and
content_part.done, or (function calls) function_call_arguments.delta and .done; output_item.done; last
response.completed, or response.incomplete when max_output_tokens ended it. Every event has a sequence_number.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from tokenizers import Tokenizer

from gateway.openai.response_bodies import TokenNames
from gateway.responses_api.to_chat import ResponsesRequest, function_namespaces
from gateway.streams.choice_stream import ChoiceEvent, TokenLogprob, Usage


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ResponseBuilder:
    def __init__(self, req: ResponsesRequest, tokenizer: Tokenizer, names: TokenNames | None = None):
        self.req = req
        self.tokenizer = tokenizer
        # With include: [message.output_text.logprobs], the logprobs of the steps that wrote message text.
        self.names = names if req.chat.top_logprobs is not None else None
        self.id = _new_id("resp")
        self.created_at = int(time.time())
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being written (the last of output)
        self.pending_space = ""  # whitespace after a call, kept in case more text follows
        self.pending_logprobs: list[dict[str, Any]] = []
        self.reasoning_text = ""
        self.sequence = 0
        self.namespaces = function_namespaces(req.body.tools or [])  # a namespaced function's calls name it

    # ----- events -----
    def start(self) -> list[dict[str, Any]]:
        snapshot = self.response("in_progress", None)
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]

    def feed(self, e: ChoiceEvent) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if e.reasoning:
            self.reasoning_text += e.reasoning
            events += self._open("reasoning")
            events += self._text_delta("response.reasoning_text.delta", e.reasoning)
        if e.text:
            text = self.pending_space + e.text
            # The text's own tokens: a stop token in the same delta wrote none of it.
            logprobs = self.pending_logprobs + self._logprobs(e.logprobs[:-1] if e.ends_on_stop_token else e.logprobs)
            if self._kind() == "function_call" and not text.strip():
                # between calls, or after the last: no message item by itself
                self.pending_space, self.pending_logprobs = text, logprobs
            else:
                self.pending_space, self.pending_logprobs = "", []
                events += self._open("message")
                events += self._text_delta("response.output_text.delta", text, logprobs)
        for call in e.tool_calls:
            if call.id is not None:
                self.pending_space = ""
                events += self._close("completed")
                item = {"id": _new_id("fc"), "type": "function_call", "status": "in_progress", "call_id": call.id,
                        "name": call.name, "arguments": ""}
                if call.name in self.namespaces:
                    item["namespace"] = self.namespaces[call.name]
                events += self._add(item)
            if call.arguments:
                self.open["arguments"] += call.arguments
                events.append(self._event("response.function_call_arguments.delta", item_id=self.open["id"],
                                          output_index=len(self.output) - 1, delta=call.arguments))
        return events

    def finish(self, finish_reason: str | None, usage: Usage) -> list[dict[str, Any]]:
        """The last events: the open item's end and the whole response (incomplete when cut by length)."""
        incomplete = finish_reason == "length"
        events: list[dict[str, Any]] = []
        if not self.output:
            events += self._open("message")  # every response says something, if only ""
        events += self._close("incomplete" if incomplete else "completed")
        final = self.response("incomplete" if incomplete else "completed", usage)
        events.append(self._event("response.incomplete" if incomplete else "response.completed", response=final))
        return events

    def fail(self, code: str | None, message: str, param: str | None, usage: Usage) -> list[dict[str, Any]]:
        """A failure once streaming: an error event, then the response as it stood, failed."""
        failed = self.response("failed", usage)
        failed["error"] = {"code": code or "server_error", "message": message}
        return [self._event("error", code=code, message=message, param=param),
                self._event("response.failed", response=failed)]

    # ----- the response object -----
    def response(self, status: str, usage: Usage | None) -> dict[str, Any]:
        body, chat = self.req.body, self.req.chat
        text_format = body.text.format if body.text is not None and body.text.format is not None else None
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "model": chat.model,
            "output": [dict(item) for item in self.output] if status != "in_progress" else [],
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "temperature": chat.params.temperature, "top_p": chat.params.top_p,
            "tool_choice": (body.tool_choice if isinstance(body.tool_choice, str) or body.tool_choice is None
                            else body.tool_choice.model_dump()) or "auto",
            "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or []],
            "text": {"format": text_format.model_dump(exclude_none=True, by_alias=True) if text_format
                     else {"type": "text"}},
            "truncation": "disabled", "store": self.req.store, "background": False,
            "previous_response_id": body.previous_response_id, "metadata": body.metadata or {},
            "user": body.user, "usage": self._usage(usage) if usage is not None else None,
            "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
        }

    def _usage(self, usage: Usage) -> dict[str, Any]:
        # The reasoning's token count is its text re-tokenized: the split is made on text, not on token ids.
        reasoning = len(self.tokenizer.encode(self.reasoning_text, add_special_tokens=False).ids) \
            if self.reasoning_text else 0
        return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens},
                "output_tokens": usage.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": min(reasoning, usage.completion_tokens)},
                "total_tokens": usage.prompt_tokens + usage.completion_tokens}

    # ----- items -----
    def _kind(self) -> str | None:
        return self.open["type"] if self.open is not None else None

    def _open(self, kind: str) -> list[dict[str, Any]]:
        if self._kind() == kind:
            return []
        events = self._close("completed")
        if kind == "message":
            item = {"id": _new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                    "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = {"id": _new_id("rs"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        events += self._add(item)
        item["content"].append(part)
        events.append(self._event("response.content_part.added", item_id=item["id"],
                                  output_index=len(self.output) - 1, content_index=0,
                                  part={**part, "logprobs": []} if "logprobs" in part else dict(part)))
        return events

    def _add(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.output.append(item)
        self.open = item
        added = {**item, "content": []} if "content" in item else dict(item)
        return [self._event("response.output_item.added", output_index=len(self.output) - 1, item=added)]

    def _logprobs(self, entries: list[TokenLogprob]) -> list[dict[str, Any]]:
        return self.names.chat_entries(entries) if self.names is not None else []

    def _text_delta(self, kind: str, text: str, logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        part = self.open["content"][0]
        part["text"] += text
        extra = {}
        if kind == "response.output_text.delta":
            part["logprobs"] += logprobs or []
            extra = {"logprobs": logprobs or []}
        return [self._event(kind, item_id=self.open["id"], output_index=len(self.output) - 1, content_index=0,
                            delta=text, **extra)]

    def _close(self, status: str) -> list[dict[str, Any]]:
        item = self.open
        if item is None:
            return []
        self.open = None
        index = len(self.output) - 1
        events = []
        if item["type"] == "function_call":
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                      output_index=index, name=item["name"], arguments=item["arguments"]))
        else:
            part = item["content"][0]
            if item["type"] == "message":
                events.append(self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                          content_index=0, text=part["text"], logprobs=part["logprobs"]))
            else:
                events.append(self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                          content_index=0, text=part["text"]))
            events.append(self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                      content_index=0, part=dict(part)))
        item["status"] = status
        events.append(self._event("response.output_item.done", output_index=index,
                                  item={**item, "content": [dict(p) for p in item["content"]]}
                                  if "content" in item else dict(item)))
        return events

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

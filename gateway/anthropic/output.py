"""A Messages API response, built from a choice's events: its content blocks (thinking, text, tool_use, in the
order the model produced them), and the stream events that build the same blocks.

One state machine serves both: a non-streamed response feeds every event and keeps the final message, a stream
sends the events as they are made, in Anthropic's order: message_start; per block content_block_start, its
deltas (thinking_delta, text_delta, input_json_delta) and content_block_stop, each with the block's index (its
position in the content); message_delta with the stop reason and the cumulative usage; message_stop. A block
is closed when the next one starts, so indices are sequential. The joined input_json_delta pieces are the
call's arguments text, which the non-streamed `input` parses.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from gateway.streams.choice_stream import ChoiceEvent, Usage


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class MessageBuilder:
    def __init__(self, model: str):
        self.model = model
        self.id = new_id("msg")
        self.content: list[dict[str, Any]] = []
        self.arguments: list[str] = []  # per block: a tool_use block's arguments text so far
        self.open = False  # the last block is still being written
        self.made_calls = False

    # ----- events -----
    def start(self, usage: Usage) -> dict[str, Any]:
        return {"type": "message_start", "message": {**self._message(None, None, usage), "content": []}}

    def feed(self, e: ChoiceEvent) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if e.reasoning:
            events += self._delta("thinking", {"type": "thinking_delta", "thinking": e.reasoning})
        if e.text and not (self.made_calls and not e.text.strip()):  # no text block of blanks after a call
            events += self._delta("text", {"type": "text_delta", "text": e.text})
        for piece in e.tool_calls:
            if piece.id is not None:
                events += self._close()
                self.made_calls = True
                self.content.append({"type": "tool_use", "id": "toolu_" + piece.id.removeprefix("call_"),
                                     "name": piece.name, "input": {}})
                self.arguments.append("")
                self.open = True
                events.append(self._block_start())
            if piece.arguments:
                self.arguments[-1] += piece.arguments
                events.append(self._block_event("content_block_delta", delta={
                    "type": "input_json_delta", "partial_json": piece.arguments}))
        return events

    def finish(self, finish_reason: str | None, stop_string: str | None, usage: Usage) -> list[dict[str, Any]]:
        events = self._close()
        reason = self.stop_reason(finish_reason, stop_string)
        events.append({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": stop_string},
                       "usage": self.usage(usage)})
        events.append({"type": "message_stop"})
        return events

    # ----- the message -----
    def message(self, finish_reason: str | None, stop_string: str | None, usage: Usage) -> dict[str, Any]:
        self._close()
        return self._message(self.stop_reason(finish_reason, stop_string), stop_string, usage)

    def stop_reason(self, finish_reason: str | None, stop_string: str | None) -> str:
        if finish_reason == "length":
            return "max_tokens"
        if stop_string is not None:
            return "stop_sequence"
        return "tool_use" if self.made_calls else "end_turn"  # a named tool choice too, as Anthropic answers it

    @staticmethod
    def usage(usage: Usage) -> dict[str, int]:
        """Anthropic's input_tokens counts the prompt less its cached prefix, which cache_read_input_tokens
        counts (the two add up to the whole prompt)."""
        return {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "output_tokens": usage.completion_tokens,
                "cache_read_input_tokens": usage.cached_tokens, "cache_creation_input_tokens": 0}

    def _message(self, reason: str | None, stop_string: str | None, usage: Usage) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": self.content,
                "stop_reason": reason, "stop_sequence": stop_string, "usage": self.usage(usage)}

    # ----- blocks -----
    def _delta(self, kind: str, delta: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if not (self.open and self.content[-1]["type"] == kind):
            events += self._close()
            self.content.append({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                                else {"type": "text", "text": ""})
            self.arguments.append("")
            self.open = True
            events.append(self._block_start())
        self.content[-1][kind] += delta[kind]
        events.append(self._block_event("content_block_delta", delta=delta))
        return events

    def _block_start(self) -> dict[str, Any]:
        block = self.content[-1]
        start = {**block, "input": {}} if block["type"] == "tool_use" else dict(block)
        return self._block_event("content_block_start", content_block=start)

    def _close(self) -> list[dict[str, Any]]:
        if not self.open:
            return []
        self.open = False
        block = self.content[-1]
        if block["type"] == "tool_use":
            block["input"] = _input(self.arguments[-1])
        return [self._block_event("content_block_stop")]

    def _block_event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "index": len(self.content) - 1, **fields}


def _input(arguments: str) -> dict[str, Any]:
    """A call's input: its arguments as an object. A call cut by max_tokens has a prefix of the object; its
    input is then {} (what the SDK's stream accumulator also keeps for JSON it cannot parse whole)."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}

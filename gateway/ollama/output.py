"""Ollama's response objects: the chunks of /api/chat (`message`) and /api/generate (`response`), streamed as
newline-delimited JSON or sent as one object, and the final chunk's done_reason, token counts and timings.

Text and reasoning go out as they come (reasoning as `thinking`). Tool calls go out whole, with their arguments as
objects (Ollama's shape, not OpenAI's strings), in one chunk before the final one: Ollama has no call fragments.
Timings are nanoseconds measured in the gateway: prompt_eval_duration from the request's arrival to its first
output, eval_duration from there to the end, load_duration 0 (the model is loaded once, at startup).
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

from gateway.streams.choice_stream import ChoiceEvent, Usage
from gateway.text.tool_call_parser import assemble

# finish_reason -> Ollama's done_reason (a call ends the turn as "stop" in Ollama).
_DONE_REASONS = {"tool_calls": "stop"}


def created_at() -> str:
    """RFC 3339 in UTC, as Ollama writes it."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class OllamaOutput:
    """One response's chunks. `kind`: "chat" (a `message` per chunk) or "generate" (a `response` string)."""

    def __init__(self, kind: str, model: str, token_names, logprobs: bool):
        self.kind, self.model, self.names, self.logprobs = kind, model, token_names, logprobs
        self.started = time.monotonic_ns()
        self.first_output: int | None = None
        self.finish_reason: str | None = None
        self._call_pieces: list = []
        self._text = self._reasoning = ""  # everything fed so far, for a response not streamed (whole)
        self._logprobs: list[dict[str, Any]] = []

    def load(self) -> dict[str, Any]:
        """The answer to a request with nothing to generate (no messages, an empty prompt): Ollama's way to load a
        model ahead of use. It is loaded already."""
        return {**self._head(), **self._content("", ""), "done": True, "done_reason": "load"}

    def feed(self, e: ChoiceEvent) -> dict[str, Any] | None:
        """The chunk carrying this event's text and reasoning (None when it has neither); its tool-call pieces
        wait for the end."""
        if self.first_output is None:
            self.first_output = time.monotonic_ns()
        self.finish_reason = e.finish_reason or self.finish_reason
        self._call_pieces += e.tool_calls
        logprobs = self._event_logprobs(e)
        self._text, self._reasoning = self._text + e.text, self._reasoning + e.reasoning
        self._logprobs += logprobs
        if not (e.text or e.reasoning or logprobs):
            return None
        chunk = {**self._head(), **self._content(e.text, e.reasoning), "done": False}
        if logprobs:
            chunk["logprobs"] = logprobs
        return chunk

    def tool_calls_chunk(self) -> dict[str, Any] | None:
        calls = self.tool_calls()
        if not calls:
            return None
        chunk = {**self._head(), **self._content("", ""), "done": False}
        chunk["message"]["tool_calls"] = calls
        return chunk

    def tool_calls(self) -> list[dict[str, Any]]:
        calls = []
        for call in assemble(self._call_pieces):
            try:
                arguments = json.loads(call["function"]["arguments"] or "{}")
            except json.JSONDecodeError:  # cut by max_tokens mid-arguments: not a call Ollama's clients can run
                continue
            calls.append({"id": call["id"], "function": {"index": len(calls), "name": call["function"]["name"],
                                                         "arguments": arguments}})
        return calls

    def final(self, usage: Usage) -> dict[str, Any]:
        """The last chunk: no text, done, the reason and the counts."""
        return {**self._head(), **self._content("", ""), **self.done_fields(usage)}

    def whole(self, usage: Usage) -> dict[str, Any]:
        """A response not streamed: everything fed, in one object."""
        body = {**self._head(), **self._content(self._text, self._reasoning), **self.done_fields(usage)}
        if self.kind == "chat" and (calls := self.tool_calls()):
            body["message"]["tool_calls"] = calls
        if self.logprobs:
            body["logprobs"] = self._logprobs
        return body

    def done_fields(self, usage: Usage) -> dict[str, Any]:
        now = time.monotonic_ns()
        first = self.first_output if self.first_output is not None else now
        reason = self.finish_reason or "stop"
        return {"done": True, "done_reason": _DONE_REASONS.get(reason, reason), "total_duration": now - self.started,
                "load_duration": 0, "prompt_eval_count": usage.prompt_tokens,
                "prompt_eval_duration": first - self.started, "eval_count": usage.completion_tokens,
                "eval_duration": now - first}

    def _event_logprobs(self, e: ChoiceEvent) -> list[dict[str, Any]]:
        """The event's token logprobs in Ollama's shape (none unless the request asked)."""
        if not self.logprobs or not e.logprobs:
            return []
        return [{"token": entry["token"], "logprob": entry["logprob"],
                 "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in entry["top_logprobs"]]}
                for entry in self.names.chat_entries(e.logprobs)]

    def _head(self) -> dict[str, Any]:
        return {"model": self.model, "created_at": created_at()}

    def _content(self, text: str, reasoning: str) -> dict[str, Any]:
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if reasoning:
                message["thinking"] = reasoning
            return {"message": message}
        return {"response": text, **({"thinking": reasoning} if reasoning else {})}

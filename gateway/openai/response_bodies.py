"""OpenAI response bodies and stream chunks for /v1/completions and /v1/chat/completions."""

from __future__ import annotations

import secrets
import time
from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer

from gateway.streams.choice_stream import ChoiceEvent, TokenLogprob, Usage
from gateway.text.detokenizer import token_bytes, token_text
from gateway.text.tool_call_parser import ToolCallDelta


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def usage_body(usage: Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


class TokenNames:
    """Display strings of token ids for logprobs (cached: the same ids recur across requests)."""

    def __init__(self, tokenizer: Tokenizer):
        self._text = lru_cache(maxsize=65536)(lambda token_id: token_text(tokenizer, token_id))
        # Exact bytes, also for a fragment of a character (whose text reads as U+FFFD).
        self._bytes = lru_cache(maxsize=65536)(lambda token_id: list(token_bytes(tokenizer, token_id)))

    def text(self, token_id: int) -> str:
        return self._text(token_id)

    def chat_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": self.text(token_id), "logprob": logprob, "bytes": self._bytes(token_id)}

    def chat_entries(self, entries: list[TokenLogprob]) -> list[dict[str, Any]]:
        """Chat's per-token logprobs (the Responses API's output_text logprobs have the same shape)."""
        return [{**self.chat_entry(e.token_id, e.logprob),
                 "top_logprobs": [self.chat_entry(t, lp) for t, lp in e.top]} for e in entries]


class _Format:
    """What every response and chunk of one request shares: id, creation time, model."""

    id_prefix = ""

    def __init__(self, model: str, names: TokenNames):
        self.id = new_id(self.id_prefix)
        self.created = int(time.time())
        self.model = model
        self.names = names

    def _body(self, object_name: str, choices: list[dict], usage: Usage | None,
              include_usage_field: bool) -> dict[str, Any]:
        body = {"id": self.id, "object": object_name, "created": self.created, "model": self.model,
                "choices": choices}
        if usage is not None:
            body["usage"] = usage_body(usage)
        elif include_usage_field:  # stream_options.include_usage: null on every chunk but the last
            body["usage"] = None
        return body


class CompletionFormat(_Format):
    id_prefix = "cmpl"

    def logprobs(self, entries: list[TokenLogprob], offset: int) -> dict[str, Any]:
        tokens, offsets = [], []
        for e in entries:
            tokens.append(self.names.text(e.token_id))
            offsets.append(offset)
            offset += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [self._top_by_text(e) for e in entries], "text_offset": offsets}

    def _top_by_text(self, entry: TokenLogprob) -> dict[str, float]:
        """The legacy top_logprobs object, keyed by token text: the token itself and its alternatives, where
        tokens that read alike share one key and the key keeps the highest of their logprobs. So the key with the
        largest value names the most likely token (lm-evaluation-harness reads greediness that way), whatever
        order the alike tokens come in."""
        top: dict[str, float] = {}
        for token_id, logprob in [(entry.token_id, entry.logprob), *entry.top]:
            text = self.names.text(token_id)
            top[text] = max(logprob, top.get(text, logprob))
        return top

    def choice(self, index: int, text: str, logprobs: dict | None, finish_reason: str | None) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def body(self, choices: list[dict], usage: Usage | None, include_usage_field: bool = False) -> dict[str, Any]:
        return self._body("text_completion", choices, usage, include_usage_field)


class ChatFormat(_Format):
    id_prefix = "chatcmpl"

    def logprobs(self, entries: list[TokenLogprob]) -> dict[str, Any]:
        return {"content": self.names.chat_entries(entries)}

    def message_choice(self, index: int, content: str, reasoning: str | None, logprobs: dict | None,
                       finish_reason: str | None, tool_calls: list[dict] | None = None) -> dict[str, Any]:
        # With tool calls and no text, content is null (as OpenAI returns it).
        message: dict[str, Any] = {"role": "assistant", "content": None if tool_calls and not content else content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if tool_calls:
            message["tool_calls"] = tool_calls
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}

    def delta_choices(self, event: ChoiceEvent, with_logprobs: bool) -> list[dict[str, Any]]:
        """A stream event's choice, as one chunk's choice or more: each carries one call's piece at most, as
        OpenAI's stream does, so a client that reads a chunk's first tool_calls entry misses nothing. The
        text comes with the first; logprobs and the finish reason with the last. The role went out in each
        choice's first chunk already."""
        delta: dict[str, Any] = {}
        if event.reasoning:
            delta["reasoning_content"] = event.reasoning
        if event.text:
            delta["content"] = event.text
        deltas = [delta]
        for k, piece in enumerate(event.tool_calls):
            if k:
                deltas.append({})
            deltas[-1]["tool_calls"] = [_tool_call_delta(piece)]
        choices = [{"index": event.index, "delta": d, "logprobs": None, "finish_reason": None} for d in deltas]
        choices[-1]["logprobs"] = self.logprobs(event.logprobs) if with_logprobs and event.logprobs else None
        choices[-1]["finish_reason"] = event.finish_reason
        return choices

    def body(self, choices: list[dict], usage: Usage | None, chunk: bool = False,
             include_usage_field: bool = False) -> dict[str, Any]:
        return self._body("chat.completion.chunk" if chunk else "chat.completion", choices, usage,
                          include_usage_field)


def _tool_call_delta(d: ToolCallDelta) -> dict[str, Any]:
    """A call's first piece carries id, type and name; the later ones only argument text."""
    if d.id is not None:
        return {"index": d.index, "id": d.id, "type": "function", "function": {"name": d.name, "arguments": d.arguments}}
    return {"index": d.index, "function": {"arguments": d.arguments}}

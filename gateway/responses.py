"""OpenAI response bodies and stream chunks for /v1/completions and /v1/chat/completions."""

from __future__ import annotations

import secrets
import time
from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer

from gateway.detokenizer import token_bytes, token_text
from gateway.generation import ChoiceEvent, TokenLogprob, Usage


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


class CompletionFormat:
    def __init__(self, model: str, names: TokenNames):
        self.id = new_id("cmpl")
        self.created = int(time.time())
        self.model = model
        self.names = names

    def logprobs(self, entries: list[TokenLogprob], offset: int) -> dict[str, Any]:
        tokens, offsets = [], []
        for e in entries:
            tokens.append(self.names.text(e.token_id))
            offsets.append(offset)
            offset += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{self.names.text(t): lp for t, lp in [(e.token_id, e.logprob), *e.top]}
                                 for e in entries],
                "text_offset": offsets}

    def choice(self, index: int, text: str, logprobs: dict | None, finish_reason: str | None) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def body(self, choices: list[dict], usage: Usage | None, include_usage_field: bool = False) -> dict[str, Any]:
        body = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": choices}
        if usage is not None:
            body["usage"] = usage_body(usage)
        elif include_usage_field:
            body["usage"] = None
        return body


class ChatFormat:
    def __init__(self, model: str, names: TokenNames):
        self.id = new_id("chatcmpl")
        self.created = int(time.time())
        self.model = model
        self.names = names

    def logprobs(self, entries: list[TokenLogprob]) -> dict[str, Any]:
        return {"content": [{**self.names.chat_entry(e.token_id, e.logprob),
                             "top_logprobs": [self.names.chat_entry(t, lp) for t, lp in e.top]} for e in entries]}

    def message_choice(self, index: int, content: str, reasoning: str | None, logprobs: dict | None,
                       finish_reason: str | None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}

    def delta_choice(self, event: ChoiceEvent, first: bool, with_logprobs: bool) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if event.reasoning:
            delta["reasoning_content"] = event.reasoning
        if event.text or (first and not event.reasoning):
            delta["content"] = event.text
        return {"index": event.index, "delta": delta,
                "logprobs": self.logprobs(event.logprobs) if with_logprobs and event.logprobs else None,
                "finish_reason": event.finish_reason}

    def body(self, choices: list[dict], usage: Usage | None, chunk: bool = False,
             include_usage_field: bool = False) -> dict[str, Any]:
        body = {"id": self.id, "object": "chat.completion.chunk" if chunk else "chat.completion",
                "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            body["usage"] = usage_body(usage)
        elif include_usage_field:
            body["usage"] = None
        return body

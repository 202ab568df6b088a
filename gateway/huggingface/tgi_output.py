"""TGI's response objects, from a completion's ChoiceEvents: /generate's `{"generated_text", "details"}` and
/generate_stream's per-token events `{"index", "token": {"id", "text", "logprob", "special"}, "top_tokens",
"generated_text", "details"}`, of which only the last carries the whole text (and, when asked, the details).

A streamed token's `text` is the text it adds, so the tokens' texts add up to generated_text exactly: its own decoded
text, or where an event's tokens' own texts do not add up to the event's text (a character split over two tokens,
written with the second as TGI's incremental decoding writes it), the event's text on its last token that is not
special. Each token is sent as soon as it comes; the one that ends the choice carries generated_text.
In details.tokens each token's text is its own decoded text, as TGI's details list it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer

from gateway.openai.response_bodies import TokenNames
from gateway.streams.choice_stream import ChoiceEvent, TokenLogprob, Usage
from gateway.text.prompt_logprobs import PromptLogprob


@lru_cache(maxsize=4)
def special_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """The ids of the tokenizer's special tokens (EOS and the like), which TGI marks `special`."""
    return frozenset(i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special)


@dataclass
class TgiRequestView:
    """What the response objects need from the request."""

    prompt_text: str
    prompt_ids: list[int]
    return_full_text: bool
    details: bool
    prefill_details: bool  # decoder_input_details
    top_n_tokens: int
    seed: int | None  # the seed a sampling request gave; None when greedy or not given


@dataclass
class TgiOutput:
    request: TgiRequestView
    names: TokenNames
    special: frozenset[int]
    text: str = ""
    finish_reason: str | None = None
    tokens: list[TokenLogprob] = field(default_factory=list)
    prefill: list[PromptLogprob] | None = None
    _carried: str = ""  # stream: text that came with no token, sent with the next one
    _last_id: int | None = None
    _index: int = 0

    def feed(self, e: ChoiceEvent, usage: Usage) -> list[dict[str, Any]]:
        """The stream events of a choice event, one per token, sent as they come; the token that ends the choice
        carries the whole text and (when asked) the details. `usage`: the request's, complete by the time the
        event that ends the choice is fed (the engine sends a choice's finish with its last token)."""
        self.text += e.text
        self.tokens += e.logprobs
        if e.prompt_logprobs is not None:
            self.prefill = e.prompt_logprobs
        if e.finish_reason is not None:
            self.finish_reason = _finish_reason(e)
        if not e.logprobs:  # text with no token (a detokenizer's flush with no token): it goes with the next one
            self._carried += e.text
            return [self._closing(usage)] if e.finish_reason is not None and self._carried else []
        texts = self._texts(e)
        texts[0], self._carried = self._carried + texts[0], ""
        out = []
        for lp, text in zip(e.logprobs, texts):
            self._index += 1
            event = {"index": self._index, "token": self._token(lp.token_id, lp.logprob, text),
                     "generated_text": None, "details": None}
            if self.request.top_n_tokens:
                event["top_tokens"] = [self._token(t, lp_, self.names.text(t)) for t, lp_ in lp.top]
            out.append(event)
        self._last_id = e.logprobs[-1].token_id
        if e.finish_reason is not None:
            self._finish(out[-1], usage)
        return out

    def _closing(self, usage: Usage) -> dict[str, Any]:
        """The last event when the choice ended on an event with text and no token: that text, under the last
        token's id, marked special (no token of its own)."""
        self._index += 1
        event = {"index": self._index, "token": {"id": self._last_id if self._last_id is not None else 0,
                                                 "text": self._carried, "logprob": None, "special": True},
                 "generated_text": None, "details": None}
        self._carried = ""
        self._finish(event, usage)
        return event

    def _finish(self, event: dict[str, Any], usage: Usage) -> None:
        event["generated_text"] = self.generated_text()
        if self.request.details:
            event["details"] = {"finish_reason": self.finish_reason or "length",
                                "generated_tokens": usage.completion_tokens, "seed": self.request.seed,
                                "input_length": usage.prompt_tokens}

    def whole(self, usage: Usage) -> dict[str, Any]:
        """/generate's answer."""
        body: dict[str, Any] = {"generated_text": self.generated_text()}
        if self.request.details or self.request.prefill_details:
            details: dict[str, Any] = {
                "finish_reason": self.finish_reason or "length", "generated_tokens": usage.completion_tokens,
                "seed": self.request.seed, "prefill": self._prefill(),
                "tokens": [self._token(t.token_id, t.logprob, self.names.text(t.token_id)) for t in self.tokens]}
            if self.request.top_n_tokens:
                details["top_tokens"] = [[self._token(i, lp, self.names.text(i)) for i, lp in t.top]
                                         for t in self.tokens]
            body["details"] = details
        return body

    def generated_text(self) -> str:
        return (self.request.prompt_text if self.request.return_full_text else "") + self.text

    def _texts(self, e: ChoiceEvent) -> list[str]:
        """Each of the event's tokens' share of its text: each its own decoded text where those add up to the
        event's text (an event may carry several steps' tokens), else all of it on the last token that is not
        special."""
        texts = [""] * len(e.logprobs)
        plain = [i for i, lp in enumerate(e.logprobs) if lp.token_id not in self.special]
        own = {i: self.names.text(e.logprobs[i].token_id) for i in plain}
        if len(plain) > 1 and "".join(own.values()) == e.text:
            for i, text in own.items():
                texts[i] = text
        elif texts:
            texts[plain[-1] if plain else -1] = e.text
        return texts

    def _prefill(self) -> list[dict[str, Any]]:
        if not self.request.prefill_details or self.prefill is None:
            return []
        first = self.request.prompt_ids[0]
        return [{"id": first, "text": self.names.text(first), "logprob": None},
                *({"id": p.token_id, "text": self.names.text(p.token_id), "logprob": p.logprob} for p in self.prefill)]

    def _token(self, token_id: int, logprob: float, text: str) -> dict[str, Any]:
        return {"id": token_id, "text": text, "logprob": logprob, "special": token_id in self.special}


def _finish_reason(e: ChoiceEvent) -> str:
    """TGI's names: a stop string ends a choice as stop_sequence, any other stop (the EOS, a stop token, a grammar
    complete) as eos_token."""
    if e.finish_reason == "stop":
        return "stop_sequence" if e.stop_string is not None else "eos_token"
    return "length"

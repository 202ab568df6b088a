"""llama.cpp's /completion answers, from a completion's ChoiceEvents: the whole answer `{"content", "tokens",
"stop": true, "stop_type", "stopping_word", "tokens_predicted", "tokens_evaluated", "timings", ...}`, and the stream's
events, one per choice event with its text, token ids and (n_probs) probabilities, then a last one with `stop`
true, empty content and the whole answer's other fields, as llama.cpp's server ends its stream. With
`response_fields` the whole answer and that last event carry only the fields named (editor plugins name theirs).

stop_type is llama.cpp's: "eos" (the model's end token, a stop token or a finished grammar), "word" (a stop string,
named in stopping_word) or "limit" (n_predict, the context, or one of the code-completion stops n_indent and
t_max_predict_ms, gateway/llamacpp/early_stop.py, after which `stopped` is true and the caller ends the request).
The end token is neither in `tokens` nor in completion_probabilities, as llama.cpp leaves it out of both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.llamacpp.early_stop import EarlyStop
from gateway.openai.response_bodies import TokenNames
from gateway.streams.choice_stream import ChoiceEvent, TokenLogprob, Usage


@dataclass(frozen=True)
class Times:
    """time.monotonic() of the request's arrival, its first token and its last (None: none yet)."""

    arrival: float
    first_token: float | None
    last_token: float | None


@dataclass
class LlamaRequestView:
    """What the answers need from the request."""

    model: str
    prompt_text: str
    settings: dict[str, Any]  # the sampling settings it ran with (generation_settings)
    n_probs: int
    return_tokens: bool
    n_indent: int = 0
    t_max_predict_ms: int = 0
    response_fields: tuple[str, ...] = ()  # the final answer's fields to return (all when empty)


@dataclass
class LlamaOutput:
    request: LlamaRequestView
    names: TokenNames
    content: str = ""
    tokens: list[int] = field(default_factory=list)
    probs: list[TokenLogprob] = field(default_factory=list)
    stop_type: str = "none"
    stopping_word: str = ""
    early: EarlyStop = field(init=False)

    def __post_init__(self) -> None:
        self.early = EarlyStop(self.request.n_indent, self.request.t_max_predict_ms)

    @property
    def stopped(self) -> bool:
        """Whether a code-completion stop ended the text: the caller ends the request."""
        return self.early.stopped

    def feed(self, e: ChoiceEvent, usage: Usage, first_token_time: float | None = None) -> dict[str, Any] | None:
        """The stream event of a choice event (None when it carries nothing); the closing event is `closing()`.
        first_token_time: time.monotonic() of the request's first token (for t_max_predict_ms)."""
        if self.stopped:
            return None
        ids, probs = e.token_ids, e.logprobs
        if e.ends_on_stop_token:
            ids, probs = ids[:-1], probs[:-1]
        text = self.early.take(e.text, first_token_time, time.monotonic())
        self.content += text
        self.tokens += ids
        self.probs += probs
        if self.stopped:
            self.stop_type, self.stopping_word = "limit", ""
        elif e.finish_reason is not None:
            self.stop_type = "limit" if e.finish_reason == "length" else "word" if e.stop_string else "eos"
            self.stopping_word = e.stop_string or ""
        if not text and not ids:
            return None
        # A stream's pieces always carry their token ids (llama-server's do); return_tokens is for the whole answer.
        event: dict[str, Any] = {"index": 0, "content": text, "tokens": ids, "stop": False, "id_slot": -1,
                                 "tokens_predicted": usage.completion_tokens, "tokens_evaluated": usage.prompt_tokens}
        if self.request.n_probs:
            event["completion_probabilities"] = self._probabilities(probs)
        return event

    def closing(self, usage: Usage, times: Times) -> dict[str, Any]:
        """The stream's last event: stop true, no content, the whole answer's other fields."""
        closing = {**self._answer(usage, times), "content": "", "tokens": []}
        closing.pop("completion_probabilities", None)  # each token's went out with it
        return _picked(closing, self.request.response_fields)

    def whole(self, usage: Usage, times: Times) -> dict[str, Any]:
        return _picked(self._answer(usage, times), self.request.response_fields)

    def _answer(self, usage: Usage, times: Times) -> dict[str, Any]:
        body = {"index": 0, "content": self.content, "tokens": self.tokens if self.request.return_tokens else [],
                "id_slot": 0, "stop": True, "model": self.request.model,
                "tokens_predicted": usage.completion_tokens, "tokens_evaluated": usage.prompt_tokens,
                "generation_settings": self.request.settings, "prompt": self.request.prompt_text,
                "has_new_line": "\n" in self.content, "truncated": False, "stop_type": self.stop_type,
                "stopping_word": self.stopping_word, "tokens_cached": usage.cached_tokens,
                "timings": _timings(usage, times)}
        if self.request.n_probs:
            body["completion_probabilities"] = self._probabilities(self.probs)
        return body

    def _probabilities(self, probs: list[TokenLogprob]) -> list[dict[str, Any]]:
        return [{"id": p.token_id, **self.names.chat_entry(p.token_id, p.logprob),
                 "top_logprobs": [{"id": t, **self.names.chat_entry(t, lp)} for t, lp in p.top]} for p in probs]



def _picked(answer: dict[str, Any], paths: tuple[str, ...]) -> dict[str, Any]:
    """llama-server's response_fields: only the named fields, a nested one named by its path ("timings/prompt_n")
    and returned at the top under that path; a field the answer lacks is left out. No paths: the whole answer."""
    if not paths:
        return answer
    picked: dict[str, Any] = {}
    for path in paths:
        value: Any = answer
        for key in path.split("/"):
            if not (isinstance(value, dict) and key in value):
                break
            value = value[key]
        else:
            picked[path] = value
    return picked


def _timings(usage: Usage, times: Times) -> dict[str, float]:
    """Milliseconds as the gateway saw them: from the request's arrival to its first token, then to its last."""
    first = times.first_token if times.first_token is not None else times.arrival
    last = times.last_token if times.last_token is not None else first
    prompt_ms, predicted_ms = (first - times.arrival) * 1000, (last - first) * 1000
    prompt_n, predicted_n = usage.prompt_tokens - usage.cached_tokens, usage.completion_tokens
    return {"cache_n": usage.cached_tokens, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1000 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
            # the first token came with the prompt's time: the rate is of the ones after it
            "predicted_per_second": 1000 * (predicted_n - 1) / predicted_ms if predicted_ms else 0.0}

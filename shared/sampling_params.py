"""Per-request sampling parameters, shared by the gateway (which builds them) and the worker (which obeys them).

Field names and defaults follow OpenAI's API plus the extensions vLLM users expect (top_k, min_p,
repetition_penalty, ignore_eos, min_tokens, stop_token_ids, allowed_token_ids, bad_words). Validation happens
once, here, so the engine can trust every instance it receives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.request_limits import (FREQUENCY_PENALTY, LOGIT_BIAS, LOGPROBS, MAX_BAD_WORD_TOKENS, MAX_BAD_WORDS,
                                   MAX_GRAMMAR_CHARS, MAX_TOKENS, MIN_P, MIN_TOKENS, N, PRESENCE_PENALTY, PRIORITY,
                                   REPETITION_PENALTY, SEED, TEMPERATURE, TOKEN_ID, TOP_K, TOP_P)

# Temperatures below this sample greedily (as vLLM's _SAMPLING_EPS): dividing float32 logits by, say, 1e-45
# overflows to inf, and inf - inf would make every probability NaN.
GREEDY_BELOW_TEMPERATURE = 1e-5


class SamplingParamsError(ValueError):
    """An invalid sampling parameter; ``param`` names it the way the HTTP API spells it."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    max_tokens: int | None = None  # None: up to the model's context length
    temperature: float = 1.0  # 0 (or below GREEDY_BELOW_TEMPERATURE) means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) disables
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    logprobs: int | None = None  # None: no logprobs; k: the sampled token's plus k top alternatives
    # None: none; k: every prompt token's logprob (after the first), its rank and k top alternatives.
    # A request that asks for them is never served from the prefix cache: every position is computed.
    prompt_logprobs: int | None = None
    # Structured output: an llguidance grammar (the serialized form `llguidance.LLMatcher` takes) that
    # every output token must follow; None: unconstrained.
    grammar: str | None = None
    # vLLM's request priority: under --scheduling-policy priority, lower is admitted first and preempted last
    # (worker/core/scheduler.py); under fcfs the gateway accepts only the default, 0.
    priority: int = 0
    # vLLM's allowed_token_ids: only these tokens may be sampled (None: any).
    allowed_token_ids: tuple[int, ...] | None = None
    # vLLM's bad_words, as the gateway tokenized them: a sequence's last token is banned wherever the output so
    # far ends with the rest of it (a one-token word everywhere).
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "logit_bias", {int(k): float(v) for k, v in self.logit_bias.items()})
        if self.allowed_token_ids is not None:
            object.__setattr__(self, "allowed_token_ids", tuple(int(t) for t in self.allowed_token_ids))
        object.__setattr__(self, "bad_words_token_ids",
                           tuple(tuple(int(t) for t in word) for word in self.bad_words_token_ids))
        self._validate()

    def _validate(self) -> None:
        def check(ok: bool, param: str, message: str) -> None:
            if not ok:
                raise SamplingParamsError(param, message)

        check(N.contains(self.n), "n", f"n must be between {N.lo} and {N.hi}, got {self.n}")
        # 0 scores the prompt without generating (the gateway allows it only with echo, as vLLM does).
        check(self.max_tokens is None or MAX_TOKENS.contains(self.max_tokens), "max_tokens",
              f"max_tokens must not be negative, got {self.max_tokens}")
        check(TEMPERATURE.contains(self.temperature), "temperature",
              f"temperature must be between {TEMPERATURE.lo} and {TEMPERATURE.hi}, got {self.temperature}")
        check(TOP_P.contains(self.top_p), "top_p", f"top_p must be in ({TOP_P.lo}, {TOP_P.hi}], got {self.top_p}")
        check(TOP_K.contains(self.top_k), "top_k",
              f"top_k must be -1, 0 or positive (at most {TOP_K.hi}), got {self.top_k}")
        check(MIN_P.contains(self.min_p), "min_p", f"min_p must be in [{MIN_P.lo}, {MIN_P.hi}], got {self.min_p}")
        check(PRESENCE_PENALTY.contains(self.presence_penalty), "presence_penalty",
              f"presence_penalty must be between {PRESENCE_PENALTY.lo} and {PRESENCE_PENALTY.hi}, "
              f"got {self.presence_penalty}")
        check(FREQUENCY_PENALTY.contains(self.frequency_penalty), "frequency_penalty",
              f"frequency_penalty must be between {FREQUENCY_PENALTY.lo} and {FREQUENCY_PENALTY.hi}, "
              f"got {self.frequency_penalty}")
        check(REPETITION_PENALTY.contains(self.repetition_penalty), "repetition_penalty",
              f"repetition_penalty must be between {REPETITION_PENALTY.lo} and {REPETITION_PENALTY.hi}, "
              f"got {self.repetition_penalty}")
        for token, bias in self.logit_bias.items():
            check(LOGIT_BIAS.contains(bias), "logit_bias",
                  f"logit_bias values must be between {LOGIT_BIAS.lo} and {LOGIT_BIAS.hi}, got {bias} "
                  f"for token {token}")
            check(TOKEN_ID.contains(token), "logit_bias",
                  f"logit_bias token ids must be non-negative (at most {TOKEN_ID.hi}), got {token}")
        check(MIN_TOKENS.contains(self.min_tokens), "min_tokens",
              f"min_tokens must be non-negative (at most {MIN_TOKENS.hi}), got {self.min_tokens}")
        check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
              f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        check(all(TOKEN_ID.contains(t) for t in self.stop_token_ids), "stop_token_ids",
              f"stop_token_ids must be non-negative (at most {TOKEN_ID.hi})")
        check(self.seed is None or SEED.contains(self.seed), "seed",
              f"seed must be between {SEED.lo} and {SEED.hi}, got {self.seed}")
        check(self.logprobs is None or LOGPROBS.contains(self.logprobs), "logprobs",
              f"logprobs must be between {LOGPROBS.lo} and {LOGPROBS.hi}, got {self.logprobs}")
        check(self.prompt_logprobs is None or LOGPROBS.contains(self.prompt_logprobs), "prompt_logprobs",
              f"prompt_logprobs must be between {LOGPROBS.lo} and {LOGPROBS.hi}, got {self.prompt_logprobs}")
        check(PRIORITY.contains(self.priority), "priority",
              f"priority must be an integer between {PRIORITY.lo} and {PRIORITY.hi}, got {self.priority}")
        check(self.allowed_token_ids is None or len(self.allowed_token_ids) > 0, "allowed_token_ids",
              "allowed_token_ids must not be empty")
        check(all(TOKEN_ID.contains(t) for t in self.allowed_token_ids or ()), "allowed_token_ids",
              f"allowed_token_ids must be non-negative (at most {TOKEN_ID.hi})")
        check(len(self.bad_words_token_ids) <= 2 * MAX_BAD_WORDS  # a word and its form after a space
              and all(0 < len(w) <= MAX_BAD_WORD_TOKENS and all(TOKEN_ID.contains(t) for t in w)
                      for w in self.bad_words_token_ids),
              "bad_words", "each bad word must be a non-empty sequence of token ids")
        check(self.grammar is None or (isinstance(self.grammar, str) and 0 < len(self.grammar) <= MAX_GRAMMAR_CHARS),
              "response_format", f"a grammar must be a non-empty string of at most {MAX_GRAMMAR_CHARS} characters")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE or self.top_k == 1

    def check_token_ids(self, vocab_size: int) -> None:
        """Token ids given by the client must exist in the model's vocabulary."""
        for param, ids in (("logit_bias", self.logit_bias.keys()), ("stop_token_ids", self.stop_token_ids),
                           ("allowed_token_ids", self.allowed_token_ids or ()),
                           ("bad_words", [t for word in self.bad_words_token_ids for t in word])):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise SamplingParamsError(param, f"token id {bad[0]} is outside the vocabulary (size {vocab_size})")

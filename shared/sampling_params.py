"""Per-request sampling parameters, shared by the gateway (which builds them) and the worker (which obeys them).

Field names and defaults follow OpenAI's API plus the extensions vLLM users expect (top_k, min_p,
repetition_penalty, ignore_eos, min_tokens, stop_token_ids). Validation happens once, here, so the
engine can trust every instance it receives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_LOGPROBS = 20
# Temperatures below this sample greedily (as vLLM's _SAMPLING_EPS): dividing float32 logits by, say, 1e-45
# overflows to inf, and inf - inf would make every probability NaN.
GREEDY_BELOW_TEMPERATURE = 1e-5
# repetition_penalty divides the positive logits of seen tokens: a divisor near 0 (5e-324 is a valid float)
# overflows them to inf, and the draw then reads NaN probabilities. 0.01 keeps every logit finite.
MIN_REPETITION_PENALTY = 0.01
MAX_N = 128
# An llguidance grammar (a JSON schema or Lark text compiled by the gateway) bigger than this is refused.
MAX_GRAMMAR_CHARS = 1 << 20


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

    def __post_init__(self) -> None:
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "logit_bias", {int(k): float(v) for k, v in self.logit_bias.items()})
        self._validate()

    def _validate(self) -> None:
        def check(ok: bool, param: str, message: str) -> None:
            if not ok:
                raise SamplingParamsError(param, message)

        check(1 <= self.n <= MAX_N, "n", f"n must be between 1 and {MAX_N}, got {self.n}")
        # 0 scores the prompt without generating (the gateway allows it only with echo, as vLLM does).
        check(self.max_tokens is None or self.max_tokens >= 0, "max_tokens",
              f"max_tokens must not be negative, got {self.max_tokens}")
        check(0.0 <= self.temperature <= 2.0, "temperature",
              f"temperature must be between 0 and 2, got {self.temperature}")
        check(0.0 < self.top_p <= 1.0, "top_p", f"top_p must be in (0, 1], got {self.top_p}")
        check(self.top_k >= 0, "top_k", f"top_k must be -1, 0 or positive, got {self.top_k}")
        check(0.0 <= self.min_p <= 1.0, "min_p", f"min_p must be in [0, 1], got {self.min_p}")
        check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty",
              f"presence_penalty must be between -2 and 2, got {self.presence_penalty}")
        check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty",
              f"frequency_penalty must be between -2 and 2, got {self.frequency_penalty}")
        check(MIN_REPETITION_PENALTY <= self.repetition_penalty <= 10.0, "repetition_penalty",
              f"repetition_penalty must be between {MIN_REPETITION_PENALTY} and 10, got {self.repetition_penalty}")
        for token, bias in self.logit_bias.items():
            check(-100.0 <= bias <= 100.0, "logit_bias",
                  f"logit_bias values must be between -100 and 100, got {bias} for token {token}")
            check(token >= 0, "logit_bias", f"logit_bias token ids must be non-negative, got {token}")
        check(self.min_tokens >= 0, "min_tokens", f"min_tokens must be non-negative, got {self.min_tokens}")
        check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
              f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        check(all(t >= 0 for t in self.stop_token_ids), "stop_token_ids",
              "stop_token_ids must be non-negative")
        check(self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
              f"logprobs must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}")
        check(self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS, "prompt_logprobs",
              f"prompt_logprobs must be between 0 and {MAX_LOGPROBS}, got {self.prompt_logprobs}")
        check(self.grammar is None or (isinstance(self.grammar, str) and 0 < len(self.grammar) <= MAX_GRAMMAR_CHARS),
              "response_format", f"a grammar must be a non-empty string of at most {MAX_GRAMMAR_CHARS} characters")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE or self.top_k == 1

    def check_token_ids(self, vocab_size: int) -> None:
        """Token ids given by the client must exist in the model's vocabulary."""
        for param, ids in (("logit_bias", self.logit_bias.keys()), ("stop_token_ids", self.stop_token_ids)):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise SamplingParamsError(param, f"token id {bad[0]} is outside the vocabulary (size {vocab_size})")

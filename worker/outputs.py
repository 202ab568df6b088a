"""What the engine reports per step: typed values the worker process turns into wire messages."""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.runner.prompt_logprobs import PromptTokenLogprob
from worker.runner.sampler import TokenLogprobs


class RequestRejected(ValueError):
    """A request the engine can never serve (too long, bad token ids, duplicate id); ``param`` names the
    offending request field where there is one."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class SequenceOutput:
    """New tokens of one choice (request_id, index) since the previous step."""

    request_id: str
    index: int
    new_token_ids: list[int]
    logprobs: list[TokenLogprobs] | None  # one per new token when the request asked for logprobs
    finish_reason: str | None  # None while running; "stop", "length", "abort" or "deadline"
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    # The stop token (an EOS, or a stop_token_ids entry) that ended the choice: the last of its tokens.
    stop_token_id: int | None = None
    queue_time: float | None = None  # seconds from arrival to first admission (None before admission)
    # Once per request when asked for, on the output that completes the prompt: entry i scores prompt token i + 1.
    prompt_logprobs: list[PromptTokenLogprob] | None = None
    pooled: list[float] | None = None  # --task embed|score: the prompt's vector (or [score]), on its last output


@dataclass
class Completion:
    """A finished request, gathered by LLMEngine.generate (offline use and tests)."""

    request_id: str
    num_prompt_tokens: int
    token_ids: list[list[int]] = field(default_factory=list)  # per choice
    logprobs: list[list[TokenLogprobs]] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)
    num_cached_tokens: int = 0
    prompt_logprobs: list[PromptTokenLogprob] | None = None  # entry i scores prompt token i + 1

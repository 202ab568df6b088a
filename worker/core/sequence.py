"""One generated continuation (a request with n > 1 owns n of them) and its progress through the engine."""

from __future__ import annotations

import time
from enum import Enum

import torch

from shared.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, request_id: str, index: int, prompt_token_ids: list[int], params: SamplingParams,
                 max_tokens: int, generator: torch.Generator, tenant: str = "", tenant_weight: float = 1.0):
        self.request_id = request_id
        # Who sent it (an API key's name; "" when the server has no keys) and that tenant's share of the
        # engine: the scheduler admits weighted-fair between tenants (worker/core/fair_queue.py).
        self.tenant = tenant
        self.tenant_weight = tenant_weight
        self.arrival_order: int | None = None  # set when it first queues; breaks ties between tenants
        self.index = index  # which of the request's n choices this is
        self.params = params
        self.max_tokens = max_tokens  # params.max_tokens resolved against the context length
        self.generator = generator
        self.num_prompt_tokens = len(prompt_token_ids)
        self.token_ids: list[int] = list(prompt_token_ids)  # prompt, then outputs
        self.status = SequenceStatus.WAITING
        # Tokens whose K/V sit in the cache; the rest are fed to the model by coming steps.
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        # Chained digests of this sequence's full, computed blocks (see BlockManager).
        self.block_hashes: list[bytes] = []
        self.num_cached_prompt_tokens: int | None = None  # prefix-cache hits at first admission
        self.finish_reason: str | None = None
        self.stop_token_id: int | None = None
        self.num_preemptions = 0
        self.arrival_time = time.monotonic()
        self.queue_time: float | None = None  # seconds from arrival to first admission
        self.deadline: float | None = None  # time.monotonic() by which the request must be done
        # Prompt scoring, by the choice that prefills the prompt (the others share it): entry i is the
        # logprob of prompt token i + 1. None when not asked for, and again once sent.
        self.prompt_logprobs: list | None = [] if params.prompt_logprobs is not None and index == 0 else None
        self.grammar = None  # worker.runner.structured_output.SequenceGrammar for structured output
        # Speculative decoding (worker/spec/): tokens guessed to follow token_ids, fed with the last token
        # and verified in the next step; never part of token_ids until accepted.
        self.draft_token_ids: list[int] = []
        self.spec_state = None  # worker.spec.acceptance.AcceptanceTracker while the engine speculates
        # Pooling requests (--task embed|score; worker/runner/pooler.py): the state gathered over the prompt's
        # chunks, and the result once the prompt is computed. Mean and CLS pooling read every position.
        self.pools_every_position = False
        self.pooling_state = None  # torch.Tensor [hidden] float32
        self.pooled: list[float] | None = None

    @property
    def computes_whole_prompt(self) -> bool:
        """Every prompt position must run through the model (scored, or pooled over), so the sequence takes
        no prefix-cache hits (its blocks are still shared with later requests)."""
        return self.needs_prompt_logprobs or self.pools_every_position

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[:self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Still scoring its prompt: every prompt position must run through the model, so such a
        sequence takes no prefix-cache hits (its blocks are still shared with later requests)."""
        return self.prompt_logprobs is not None

    @property
    def prompt_logprobs_complete(self) -> bool:
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) == self.num_prompt_tokens - 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id}#{self.index}, {self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens}, blocks={self.block_table})")

"""Prompt scoring: the logprob of every prompt token given the tokens before it, computed during prefill.

A sequence that asks for prompt logprobs has logits computed for every position of each prefill chunk
(not just the sampling one); the hidden state at position q scores the prompt token at q + 1. Chunked
prefill fills `Sequence.prompt_logprobs` a chunk at a time. Logprobs come from the raw logits (as the
sampler's own logprobs do), in float32; rank is the token's place in the vocabulary (1 = most likely,
ties counted against it, as vLLM counts them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Rows scored per slice: the logits of a whole 2048-token chunk at a 150k vocabulary would take 1.2 GB.
ROWS_PER_SLICE = 256


@dataclass
class PromptTokenLogprob:
    token_id: int
    logprob: float
    rank: int  # 1-based place of token_id among the vocabulary's logprobs
    top: list[tuple[int, float]]  # k (token_id, logprob) pairs, most likely first


@dataclass(frozen=True)
class PromptSpan:
    """One sequence's share of a step's prompt rows: [first_row, first_row + count), in position order,
    continuing its Sequence.prompt_logprobs; k top alternatives each."""

    batch_index: int
    first_row: int
    count: int
    k: int


def prompt_rows_to_score(seq, start: int, end: int) -> range:
    """Positions q in this chunk [start, end) whose hidden state scores a prompt token not yet scored."""
    if not seq.needs_prompt_logprobs:
        return range(0)
    return range(max(start, len(seq.prompt_logprobs)), min(end, seq.num_prompt_tokens - 1))


def score_prompt_rows(compute_logits: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                      targets: torch.Tensor, vocab_size: int, max_k: int) -> list[PromptTokenLogprob]:
    """hidden [rows, hidden_size], targets [rows] int64 (the next prompt token at each row) ->
    one PromptTokenLogprob per row, with max_k alternatives (callers keep their own k of them)."""
    result: list[PromptTokenLogprob] = []
    for lo in range(0, hidden.shape[0], ROWS_PER_SLICE):
        rows = slice(lo, lo + ROWS_PER_SLICE)
        lp = compute_logits(hidden[rows])[:, :vocab_size].float().log_softmax(dim=-1)  # [r, vocab] float32
        target = targets[rows, None]  # [r, 1]
        chosen = lp.gather(1, target)  # [r, 1]
        ranks = (lp >= chosen).sum(dim=-1)  # [r]
        top_vals: list[list[float]] = [[] for _ in range(lp.shape[0])]
        top_ids: list[list[int]] = [[] for _ in range(lp.shape[0])]
        if max_k:
            vals, ids = lp.topk(max_k, dim=-1)  # [r, max_k], most likely first
            top_vals, top_ids = vals.tolist(), ids.tolist()
        for token, value, rank, v, i in zip(target.squeeze(1).tolist(), chosen.squeeze(1).tolist(), ranks.tolist(),
                                            top_vals, top_ids):
            result.append(PromptTokenLogprob(token, value, rank, list(zip(i, v))))
    return result

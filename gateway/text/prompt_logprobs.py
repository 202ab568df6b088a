"""Prompt logprobs in the two shapes clients read them in.

- OpenAI's legacy completions `logprobs` for an echoed prompt (`echo` + `logprobs`, what
  lm-evaluation-harness's loglikelihood tasks send): one entry per prompt token, the first with a null
  logprob and null top_logprobs (nothing predicts it), text offsets from 0.
- vLLM's `prompt_logprobs` extension: a list with null first, then per prompt token a map from token id
  to {logprob, rank, decoded_token}, holding the prompt token itself and the k most likely tokens.

The worker sends the scores once per prompt, entry i for prompt token i + 1 (worker/runner/prompt_logprobs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class PromptLogprob:
    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]  # most likely first


def from_wire(rows: list[list[Any]]) -> list[PromptLogprob]:
    return [PromptLogprob(token, logprob, rank, [(t, lp) for t, lp in top]) for token, logprob, rank, top in rows]


def echo_logprobs(names, prompt: list[int], entries: list[PromptLogprob], k: int) -> dict[str, Any]:
    """The legacy completions logprobs of the prompt's tokens (names: gateway.openai.response_bodies.TokenNames)."""
    tokens = [names.text(t) for t in prompt]
    offsets, offset = [], 0
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": [None, *(e.logprob for e in entries)],
            "top_logprobs": [None, *({names.text(t): lp for t, lp in [(e.token_id, e.logprob), *e.top[:k]]}
                                     for e in entries)],
            "text_offset": offsets}


def join_logprobs(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Prompt logprobs followed by the completion's (same keys, lists concatenated)."""
    return {key: first[key] + second[key] for key in first}


def vllm_prompt_logprobs(names, entries: list[PromptLogprob], k: int) -> list[dict[str, Any] | None]:
    out: list[dict[str, Any] | None] = [None]
    for e in entries:
        row = {str(e.token_id): {"logprob": e.logprob, "rank": e.rank, "decoded_token": names.text(e.token_id)}}
        for rank, (token, logprob) in enumerate(e.top[:k], start=1):
            row.setdefault(str(token), {"logprob": logprob, "rank": rank, "decoded_token": names.text(token)})
        out.append(row)
    return out

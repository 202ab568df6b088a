"""Verification of drafted tokens by the target model: the sampling rows of a verification, and which
drafted tokens the target accepts.

A sequence verifying k drafts gets k + 1 rows of logits from one step: row j is the target's next-token
distribution after the drafts before j. Every row goes through the ordinary sampler with the request's
own parameters (temperature, top-p/top-k/min-p, penalties over the history the drafts extend, logit
bias, its seeded generator), and drafts are accepted while the token the target samples equals them;
the first token that differs, or the bonus token after k accepted drafts, ends the run.

For a deterministic draft (n-gram lookup, a greedy draft model) this is exact rejection sampling: the
draft x is accepted with probability p(x), and on a rejection the emitted token is distributed as p
conditioned on not being x, i.e. p with x removed and renormalized, the residual of Leviathan et al.
(arXiv 2211.17192) for a one-hot draft distribution. Greedy rows accept while the draft is the argmax.

Every emitted token also consumes exactly the one uniform that plain decoding would have drawn for it:
the rows past the first rejection drew uniforms they must give back, so a seeded generator is rewound
to its state before the step and advanced once per emitted token. With the same logits bits, a seeded
request then samples the same tokens with speculation as without.
"""

from __future__ import annotations

from collections.abc import Sequence as Tokens

import torch

from worker.core.sequence import Sequence
from worker.runner.sampler import SamplingRow


def sampling_row(seq: Sequence, drafted: Tokens[int] = ()) -> SamplingRow:
    """The row that samples seq's next token, after `drafted` (tokens verified before it in this step)."""
    params = seq.params
    # Histories are copied only for requests whose sampling reads them.
    needs_prompt = params.repetition_penalty != 1.0
    needs_output = needs_prompt or params.presence_penalty or params.frequency_penalty or params.min_tokens
    output = seq.output_token_ids + list(drafted) if needs_output else ()
    return SamplingRow(
        params=params,
        prompt_token_ids=seq.prompt_token_ids if needs_prompt else (),
        output_token_ids=output,
        generator=seq.generator,
        grammar=seq.grammar,
    )


def verification_rows(seq: Sequence) -> list[SamplingRow]:
    """k + 1 rows for a sequence verifying k drafts (seq.draft_token_ids)."""
    drafts = seq.draft_token_ids
    return [sampling_row(seq, drafts[:j]) for j in range(len(drafts) + 1)]


def num_emitted(drafts: list[int], sampled: list[int]) -> int:
    """How many of the k + 1 sampled tokens the sequence emits: the accepted drafts and the token after."""
    for j, draft in enumerate(drafts):
        if sampled[j] != draft:
            return j + 1
    return len(drafts) + 1


class GeneratorRewind:
    """Saves the generators of sampling (non-greedy) verifications before the sampler draws, and gives
    back the draws of the rows past each one's first rejection."""

    def __init__(self, seqs: list[Sequence]):
        self._saved = {id(s): s.generator.get_state() for s in seqs if not s.params.greedy}

    def settle(self, seq: Sequence, num_rows: int, emitted: int) -> None:
        state = self._saved.get(id(seq))
        if state is None or emitted == num_rows:
            return
        gen = seq.generator
        gen.set_state(state)
        for _ in range(emitted):  # the same draw the sampler makes for a row (worker/runner/sampler.py:_draw)
            torch.rand(1, dtype=torch.float64, generator=gen, device=gen.device)

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
from typing import TYPE_CHECKING

import torch

from worker.core.sequence import Sequence
from worker.runner.sampler import Sampler, SamplingRow, TokenLogprobs

if TYPE_CHECKING:
    from worker.spec.speculator import Speculator


def sampling_row(seq: Sequence, drafted: Tokens[int] = ()) -> SamplingRow:
    """The row that samples seq's next token, after `drafted` (tokens verified before it in this step)."""
    params = seq.params
    # Histories are copied only for requests whose sampling reads them.
    needs_prompt = params.repetition_penalty != 1.0
    needs_output = (needs_prompt or params.presence_penalty or params.frequency_penalty or params.min_tokens
                    or params.bad_words_token_ids)
    output = seq.output_token_ids + list(drafted) if needs_output else ()
    return SamplingRow(
        params=params,
        prompt_token_ids=seq.prompt_token_ids if needs_prompt else (),
        output_token_ids=output,
        generator=seq.generator,
        grammar=seq.grammar,
    )


def verify_in_order(sampler: Sampler, logits: torch.Tensor, seq: Sequence) -> tuple[list[int], list]:
    """A sequence with a grammar verifies row by row: row j is masked by the grammar after the drafts
    before it, so the grammar advances through each accepted draft and is rolled back afterwards (the
    engine then advances it through the emitted tokens as for any token). Rows past the first rejection
    are never sampled, so the generator draws exactly what plain decoding would, retries included.
    logits: [k + 1, vocab] -> the emitted tokens and their logprobs (entries None where not asked for)."""
    drafts = seq.draft_token_ids
    tokens: list[int] = []
    logprobs: list[TokenLogprobs | None] = []
    advanced = 0
    try:
        for j in range(len(drafts) + 1):
            out = sampler(logits[j:j + 1], [sampling_row(seq, drafts[:j])])
            tokens.append(out.token_ids[0])
            logprobs.append(out.logprobs[0])
            if j == len(drafts) or tokens[-1] != drafts[j]:
                break
            advanced += 1
            if seq.grammar.advance(drafts[j]):  # complete: nothing may follow
                break
    finally:
        seq.grammar.rollback(advanced)
    return tokens, logprobs


def verification_rows(seq: Sequence) -> list[SamplingRow]:
    """k + 1 rows for a sequence verifying k drafts (seq.draft_token_ids)."""
    drafts = seq.draft_token_ids
    return [sampling_row(seq, drafts[:j]) for j in range(len(drafts) + 1)]


def num_emitted(drafts: list[int], sampled: list[int]) -> int:
    """How many of the sampled tokens (k + 1, or fewer where a grammar completed on an accepted draft) the
    sequence emits: the accepted drafts and the token after them."""
    for j, draft in enumerate(drafts[:len(sampled)]):
        if sampled[j] != draft:
            return j + 1
    return min(len(drafts) + 1, len(sampled))


def sample_and_verify(sampler: Sampler, logits: torch.Tensor, seqs: list[tuple[Sequence, int]],
                      speculator: Speculator | None) -> list[tuple[list[int], list[TokenLogprobs | None]]]:
    """One step's sampling. seqs: each sampling sequence with its logits rows (1, or k + 1 for a
    verification), in the order of logits [rows, vocab]. Returns each one's emitted tokens and their
    logprobs; verifications are recorded and their drafts cleared."""
    rows: list[SamplingRow] = []
    picked_rows: list[int] = []  # logits rows the batched call samples
    in_order: dict[int, tuple[list[int], list]] = {}
    first = 0
    for g, (seq, count) in enumerate(seqs):
        if count > 1 and seq.grammar is not None:
            in_order[g] = verify_in_order(sampler, logits[first:first + count], seq)
        else:
            rows.extend(verification_rows(seq) if count > 1 else [sampling_row(seq)])
            picked_rows.extend(range(first, first + count))
        first += count
    rewind = GeneratorRewind([seq for g, (seq, count) in enumerate(seqs) if count > 1 and g not in in_order])
    sampled = sampler(logits if not in_order else logits[picked_rows], rows)
    picks = []
    row = 0
    for g, (seq, count) in enumerate(seqs):
        if g in in_order:
            tokens, logprobs = in_order[g]
        else:
            tokens, logprobs = sampled.token_ids[row:row + count], sampled.logprobs[row:row + count]
            row += count
        if count > 1:
            emitted = num_emitted(seq.draft_token_ids, tokens)
            rewind.settle(seq, count, emitted)
            speculator.record(seq, count - 1, emitted - 1)
            tokens, logprobs = tokens[:emitted], logprobs[:emitted]
            seq.draft_token_ids = []
        picks.append((tokens, logprobs))
    return picks


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

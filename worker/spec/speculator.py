"""Speculative decoding for the engine: which sequences draft, their drafts, and what verifying them did.

After each step, every sequence that decodes next (its last token sampled, nothing else to compute)
and may speculate gets up to k drafts in seq.draft_token_ids; the scheduler feeds them with the last
token (cutting them first when the token budget or the free blocks run short) and the engine verifies
them (worker/spec/verify.py). A sequence with a grammar (structured output, tools) keeps only the drafts
its grammar accepts from its current state (checked without consuming); its verification advances the
grammar through the accepted drafts and rolls it back (verify.py:verify_in_order).
"""

from __future__ import annotations

from shared.speculative_config import SpeculativeConfig
from worker.core.sequence import Sequence, SequenceStatus
from worker.spec.acceptance import (MIN_ACCEPTANCE, AcceptanceTracker, EngineAcceptance, SpecCounters, crowded,
                                   min_acceptance)
from worker.spec.draft_model import DraftModelProposer
from worker.spec.ngram import NgramProposer


class Speculator:
    def __init__(self, config: SpeculativeConfig, max_model_len: int, proposer):
        """proposer: propose_many([(sequence, k)], crowded) -> up to k drafts each (make_proposer builds it;
        crowded: the batch pays only for confident drafts)."""
        self.config = config
        self.k = config.num_speculative_tokens
        self.max_model_len = max_model_len
        self.proposer = proposer
        self.counters = SpecCounters(self.k)
        self.engine_acceptance = EngineAcceptance()
        self._min_acceptance = MIN_ACCEPTANCE  # for the batch drafted last

    def describe(self) -> str:
        return self.config.describe()

    def draft(self, seqs: list[Sequence]) -> None:
        """Set the drafts of each of seqs for its next step (none where it should not speculate now)."""
        wanted = []
        self._min_acceptance = min_acceptance(len(seqs))
        prior = self.engine_acceptance.chance()
        for seq in seqs:
            seq.draft_token_ids = []
            if seq.status is not SequenceStatus.RUNNING or seq.num_computed_tokens != seq.num_tokens - 1:
                continue
            # Verifying k drafts emits up to k + 1 tokens, each needing a position.
            k = min(self.k, seq.max_tokens - seq.num_output_tokens - 1, self.max_model_len - seq.num_tokens)
            if k < 1:
                continue
            if seq.spec_state is None:
                seq.spec_state = AcceptanceTracker()
            if seq.spec_state.may_draft():
                wanted.append((seq, seq.spec_state.draft_length(k, self._min_acceptance, prior)))
        if not wanted:
            return
        for (seq, _), drafts in zip(wanted, self.proposer.propose_many(wanted, crowded(self._min_acceptance))):
            if drafts and seq.grammar is not None:
                del drafts[seq.grammar.valid_prefix(drafts):]
            seq.draft_token_ids = drafts

    def record(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        self.counters.record(num_drafted, num_accepted)
        self.engine_acceptance.record(num_drafted, num_accepted)
        seq.spec_state.record(num_drafted, num_accepted, self._min_acceptance)


def make_proposer(config: SpeculativeConfig, **target):
    """The config's proposer. target (draft_model only): the engine's max_model_len, device, dtype,
    attention backend, block size, KV block count and vocab size, which the draft model shares."""
    if config.method == "ngram":
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    return DraftModelProposer(config.model, **target)

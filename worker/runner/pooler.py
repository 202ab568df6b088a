"""Pooling requests (--task embed|score): one vector per prompt from the final hidden states of its prefill.

A pooling sequence is prefill only. Its prompt may run over several steps (chunked prefill, preemption): each
step's rows add to the sequence's pooling state, and the pooled result is made from it when the chunk that
reaches the end of the prompt has run. A recomputed sequence (preempted) starts again at position 0 and so
starts its state again.

Every result is computed per sequence, from that sequence's rows only, so nothing but its own hidden states
reaches it: a request's vector does not depend on what it was batched with beyond those.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shared.pooling_config import PoolingConfig
from worker.core.scheduler import ScheduledBatch
from worker.core.sequence import Sequence
from worker.model.decoder import DecoderForCausalLM


class Pooler:
    def __init__(self, config: PoolingConfig, model: DecoderForCausalLM):
        self.config = config
        self.model = model
        if config.scorer == "classifier" and not 1 <= model.config.num_labels <= 2:
            raise ValueError(f"a classifier with {model.config.num_labels} labels cannot score "
                             "(one label: sigmoid; two: the second label's probability)")

    def prepare(self, seq: Sequence) -> None:
        seq.pools_every_position = self.config.needs_every_position

    @torch.inference_mode()
    def collect(self, batch: ScheduledBatch, hidden: torch.Tensor) -> None:
        """hidden: [num_tokens, hidden], the step's rows in batch order. Called before the sequences advance."""
        offset = 0
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            rows = hidden[offset:offset + n]  # [n, hidden]
            offset += n
            start = seq.num_computed_tokens
            self._gather(seq, rows, start)
            if start + n >= seq.num_prompt_tokens:
                seq.pooled = self._finish(seq, hidden.dtype)
                seq.pooling_state = None

    def _gather(self, seq: Sequence, rows: torch.Tensor, start: int) -> None:
        method = self.config.method
        if method == "last":
            if start + rows.shape[0] >= seq.num_prompt_tokens:
                seq.pooling_state = rows[seq.num_prompt_tokens - 1 - start].float()
        elif method == "mean":
            chunk = rows.float().sum(dim=0)  # [hidden]
            seq.pooling_state = chunk if start == 0 else seq.pooling_state + chunk
        elif start == 0:  # cls: the first position
            seq.pooling_state = rows[0].float()

    def _finish(self, seq: Sequence, dtype: torch.dtype) -> list[float]:
        state = seq.pooling_state  # [hidden] float32
        if self.config.method == "mean":
            state = state / seq.num_prompt_tokens
        if self.config.task == "embed":
            return (F.normalize(state, dim=0) if self.config.normalize else state).tolist()
        head_input = state.to(dtype)[None]  # [1, hidden] in the model's dtype
        if self.config.scorer == "classifier":
            logits = self.model.score(head_input).float()[0]  # [num_labels]
            score = torch.sigmoid(logits[0]) if logits.shape[0] == 1 \
                else torch.softmax(logits, dim=0)[self.config.positive_label]
        else:
            yes, no = self.config.yes_no_ids
            logits = self.model.compute_logits(head_input)[0]  # [vocab] float32
            score = torch.sigmoid(logits[yes] - logits[no])  # P(yes) of the two-way softmax
        return [float(score)]

"""Turns a scheduled batch into model inputs, runs the model, and returns logits for the sampling rows.

A sequence samples this step when its chunk reaches its last known token; an earlier prefill chunk
only fills the cache, and computing its logits would be wasted work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.attention import AttentionMetadata
from worker.models.decoder import DecoderForCausalLM
from worker.scheduler import ScheduledBatch


@dataclass(frozen=True)
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampling] int64: rows of the hidden states that sample
    sampling_rows: list[int]  # batch index of each sampling row


class ModelRunner:
    def __init__(self, model: DecoderForCausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 block_size: int, device: torch.device | str = "cpu"):
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device

    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        context_lens: list[int] = []
        logits_indices: list[int] = []
        sampling_rows: list[int] = []
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            start = seq.num_computed_tokens
            end = start + n
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            context_lens.append(end)
            if end == seq.num_tokens:
                logits_indices.append(len(input_ids) - 1)
                sampling_rows.append(i)
        max_blocks = max(len(seq.block_table) for seq in batch.seqs)
        tables = [seq.block_table + [0] * (max_blocks - len(seq.block_table)) for seq in batch.seqs]
        query_lens = tuple(batch.num_new_tokens)
        query_start = [0]
        for n in query_lens:
            query_start.append(query_start[-1] + n)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            context_lens=torch.tensor(context_lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(query_start, dtype=torch.int32, device=dev),
            context_lens_host=tuple(context_lens),
            query_lens_host=query_lens,
            block_size=bs,
        )
        return StepInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            meta=meta,
            logits_indices=torch.tensor(logits_indices, dtype=torch.int64, device=dev),
            sampling_rows=sampling_rows,
        )

    @torch.inference_mode()
    def execute(self, inputs: StepInputs) -> torch.Tensor:
        """Returns [num_sampling, vocab] float32 logits (empty when no sequence samples)."""
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        if not inputs.sampling_rows:
            return hidden.new_empty((0, self.model.config.vocab_size), dtype=torch.float32)
        return self.model.compute_logits(hidden[inputs.logits_indices])

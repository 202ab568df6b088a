"""Turns a scheduled batch into model inputs, runs the model, and returns logits for the sampling rows
(and the prompt logprobs of sequences scoring their prompt).

A sequence samples this step when its chunk reaches its last known token and it may still generate; an
earlier prefill chunk only fills the cache, and computing its logits would be wasted work, unless the
request asked for prompt logprobs (worker/runner/prompt_logprobs.py). For the same reason, in a step with prompt
rows only the rows read (sampling and prompt-scoring) go through the last layer past its K/V write (OutputRows).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from worker.attention.metadata import AttentionMetadata
from worker.core.scheduler import ScheduledBatch
from worker.model.decoder import DecoderForCausalLM
from worker.model.step_context import OutputRows
from worker.quant.row_modes import PromptPositions
from worker.runner.decode_graphs import CaptureFailed, DecodeGraphs, GraphStep
from worker.runner.decode_program import DecodeProgram, unsupported_reason
from worker.runner.prompt_logprobs import PromptSpan, PromptTokenLogprob, prompt_rows_to_score, score_prompt_rows
from worker.runner.step_transfer import to_device

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampling] int64: rows of the hidden states that sample
    sampling_rows: list[int]  # batch index of each sampling row (k + 1 consecutive rows for a verification)
    prompt_rows: torch.Tensor  # [num_prompt_rows] int64: rows of the hidden states that score a prompt token
    prompt_targets: torch.Tensor  # [num_prompt_rows] int64: the prompt token each of them scores
    prompt_spans: list[PromptSpan]  # which sequence each run of prompt rows belongs to
    # A step with prompt rows: the rows read after it (logits_indices and prompt_rows then index them), which
    # alone go through the last layer past its K/V (OutputRows). None: every row is computed and returned.
    outputs: OutputRows | None = None
    # Which rows are prompt positions, where the quantized projections run them apart (worker/quant/row_modes.py).
    prompt_positions: PromptPositions | None = None


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [num_sampling, vocab] float32
    prompt_logprobs: dict[int, list[PromptTokenLogprob]]  # batch index -> this step's new prompt entries
    # [num_tokens, hidden]: every row's final hidden state (pooling reads it; with StepInputs.outputs, those rows')
    hidden: torch.Tensor | None = None


class ModelRunner:
    def __init__(self, model: DecoderForCausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 block_size: int, device: torch.device | str = "cpu", decode_program: bool = False,
                 max_num_seqs: int = 1, max_model_len: int = 1, reads_every_row: bool = False,
                 prompt_rows_apart: bool = False):
        """decode_program: run decode-only steps as one kernel program where the model allows it
        (worker/runner/decode_program.py), with buffers for max_num_seqs rows of up to max_model_len tokens.
        reads_every_row: every row's final hidden state is read (pooling), so the last layer computes them all;
        otherwise a step with prompt rows takes it for its sampling and prompt-scoring rows only (OutputRows).
        prompt_rows_apart: the quantized projections quantize prompt positions' activations their own way, so each
        step says which rows those are (StepInputs.prompt_rows)."""
        self.model = model
        self.prompt_rows_apart = prompt_rows_apart
        self.reads_every_row = reads_every_row
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = torch.device(device)
        self._program_reason = unsupported_reason(model) if decode_program else "turned off"
        self._program_size = (max_num_seqs, -(-max_model_len // block_size))
        self.decode_program: DecodeProgram | None = None  # built at the first decode-only step
        self.decode_graphs: DecodeGraphs | None = None  # use_decode_graphs() turns them on
        self._graphs_reason = "not turned on"

    @property
    def decode_program_status(self) -> str:
        return "on" if self._program_reason is None else f"off ({self._program_reason})"

    @property
    def decode_graphs_status(self) -> str:
        return f"on ({self.decode_graphs.describe()})" if self.decode_graphs is not None \
            else f"off ({self._graphs_reason})"

    def use_decode_graphs(self, scratch_block: int, max_rows: int, max_model_len: int, capture: bool = True) -> None:
        """Decode steps through worker/runner/decode_graphs.py from now on, where the attention backend allows it (else
        off, saying why). scratch_block: a cache block no sequence holds (padded rows write there)."""
        if not self.model.backend.capturable_decode:
            self.decode_graphs_off(f"the {self.model.backend.name} attention backend cannot plan from bounds")
            return
        if scratch_block >= self.kv_caches[0][0].shape[0]:
            raise ValueError(f"decode graphs need a spare KV block; the cache has no block {scratch_block}")
        try:
            self.decode_graphs = DecodeGraphs(self.model, self.kv_caches, self.block_size, scratch_block, max_rows,
                                              -(-max_model_len // self.block_size), capture=capture)
        except CaptureFailed as e:
            self._graphs_failed(e)

    def decode_graphs_off(self, reason: str) -> None:
        """Every step eager from now on; decode_graphs_status says `reason`."""
        self.decode_graphs, self._graphs_reason = None, reason

    def _graphs_failed(self, error: CaptureFailed) -> None:
        log.error("DECODE GRAPHS OFF, every step runs eagerly: %s", error)
        self.decode_graphs_off(str(error))

    def prepare(self, batch: ScheduledBatch) -> StepInputs | GraphStep:
        if self.decode_graphs is not None:
            try:
                step = self.decode_graphs.prepare(batch)
            except CaptureFailed as e:
                self._graphs_failed(e)
                step = None
            if step is not None:
                return step
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        context_lens: list[int] = []
        logits_indices: list[int] = []
        sampling_rows: list[int] = []
        prompt_rows: list[int] = []
        prompt_targets: list[int] = []
        prompt_spans: list[PromptSpan] = []
        query_lens: list[int] = []
        single_prompt_rows: set[int] = set()
        tables: list[list[int]] = []  # one per attention row: a verification's k + 1 rows share its table
        token_tables: list[list[int]] = []  # one per token: its sequence's table
        is_prompt: list[bool] = []  # with prompt_rows_apart, one per token: a prompt position (not an output)
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens)):
            start = seq.num_computed_tokens
            end = start + n
            scored = prompt_rows_to_score(seq, start, end)
            if scored:
                prompt_spans.append(PromptSpan(i, len(prompt_rows), len(scored), seq.params.prompt_logprobs))
                prompt_rows.extend(len(input_ids) + q - start for q in scored)
                prompt_targets.extend(seq.token_ids[q + 1] for q in scored)
            verifies = end > seq.num_tokens  # the last token and speculative drafts: every row samples
            tokens = seq.token_ids + seq.draft_token_ids if verifies else seq.token_ids
            input_ids.extend(tokens[start:end])
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            token_tables.extend([table] * n)
            prompt_end = min(max(start, seq.num_prompt_tokens), end)
            if self.prompt_rows_apart:
                is_prompt.extend([True] * (prompt_end - start) + [False] * (end - prompt_end))
            if verifies:
                # Each row of a verification is, to attention, a one-token decode at its own position: the
                # same kernel, the same keys, so the bits plain decoding would compute for it (a chunk's
                # attention would not). Every layer writes the step's K/V before it attends, so row j sees
                # the drafts before it. The step stays a decode step, eligible for the decode program.
                context_lens.extend(range(start + 1, end + 1))
                query_lens.extend([1] * n)
                tables.extend([table] * n)
                logits_indices.extend(range(len(input_ids) - n, len(input_ids)))
                sampling_rows.extend([i] * n)
                continue
            # Output tokens computed again (a sequence preempted by recompute) attend, like a verification's rows,
            # as one-token decodes at their own positions, as they did when they were generated: their K/V, and so
            # everything after them, get the bits they had, and an output does not depend on whether other
            # requests made it yield its blocks. Prompt positions attend as a prompt chunk.
            if prompt_end > start:
                if prompt_end - start == 1:
                    single_prompt_rows.add(len(query_lens))
                context_lens.append(prompt_end)
                query_lens.append(prompt_end - start)
                tables.append(table)
            context_lens.extend(range(prompt_end + 1, end + 1))
            query_lens.extend([1] * (end - prompt_end))
            tables.extend([table] * (end - prompt_end))
            if end == seq.num_tokens and seq.num_output_tokens < seq.max_tokens:
                logits_indices.append(len(input_ids) - 1)
                sampling_rows.append(i)
        # Rows read after a step with prompt rows: they alone go through the last layer past its K/V (OutputRows),
        # each as a one-token decode at its own position (its keys are cached by then: the last layer writes the
        # step's K and V before it attends).
        read: list[int] | None = None
        if not self.reads_every_row and (single_prompt_rows or any(n > 1 for n in query_lens)):
            read = sorted(set(logits_indices) | set(prompt_rows))
            compact = {row: j for j, row in enumerate(read)}
            logits_indices = [compact[row] for row in logits_indices]
            prompt_rows = [compact[row] for row in prompt_rows]
        host = [torch.tensor(values, dtype=torch.int64)
                for values in (input_ids, positions, logits_indices, prompt_rows, prompt_targets)]
        host += _metadata_tensors(slots, tables, context_lens, query_lens)
        read_lens = [positions[r] + 1 for r in read or ()]  # each read row's keys, its own included
        if read:
            host.append(torch.tensor(read, dtype=torch.int64))
            host += _metadata_tensors([slots[r] for r in read], [token_tables[r] for r in read], read_lens,
                                      [1] * len(read))
        # Built on the host (from Python lists), then moved together: one copy on an accelerator, none on the CPU.
        moved = to_device(host, self.device)
        input_ids_t, positions_t, logits_indices_t, prompt_rows_t, prompt_targets_t = moved[:5]
        meta = self._metadata(moved[5:9], context_lens, query_lens, frozenset(single_prompt_rows))
        prompt_positions = PromptPositions.from_flags(is_prompt, self.device) if self.prompt_rows_apart else None
        outputs = None
        if read is not None:
            read_prompt_positions = PromptPositions.from_flags([is_prompt[r] for r in read], self.device) \
                if self.prompt_rows_apart else None
            outputs = OutputRows(moved[9], self._metadata(moved[10:14], read_lens, [1] * len(read), frozenset()),
                                 read_prompt_positions) \
                if read else OutputRows(torch.empty(0, dtype=torch.int64, device=self.device), None)
        return StepInputs(
            input_ids=input_ids_t,
            positions=positions_t,
            meta=meta,
            logits_indices=logits_indices_t,
            sampling_rows=sampling_rows,
            prompt_rows=prompt_rows_t,
            prompt_targets=prompt_targets_t,
            prompt_spans=prompt_spans,
            outputs=outputs,
            prompt_positions=prompt_positions,
        )

    def _metadata(self, tensors: list[torch.Tensor], context_lens: list[int], query_lens: list[int],
                  single_prompt_rows: frozenset[int]) -> AttentionMetadata:
        slot_mapping, block_tables, context_lens_t, query_start_loc = tensors  # as _metadata_tensors made them
        return AttentionMetadata(
            slot_mapping=slot_mapping,  # [num_tokens] int64
            block_tables=block_tables,  # [attention rows, max_blocks] int32
            context_lens=context_lens_t,  # [attention rows] int32
            query_start_loc=query_start_loc,  # [attention rows + 1] int32
            context_lens_host=tuple(context_lens),
            query_lens_host=tuple(query_lens),
            single_prompt_rows=single_prompt_rows,
            block_size=self.block_size,
        )

    @torch.inference_mode()
    def execute(self, inputs: StepInputs | GraphStep) -> ModelOutput:
        """Logits of the sampling rows (empty when no sequence samples) and new prompt logprobs."""
        if isinstance(inputs, GraphStep):
            return ModelOutput(self.decode_graphs.run(inputs), {})
        hidden = self._program_hidden(inputs)
        if hidden is None:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta,
                                inputs.outputs, inputs.prompt_positions)  # [tokens, hidden], or [outputs, hidden]
        vocab = self.model.config.vocab_size
        if inputs.sampling_rows:
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
        else:
            logits = hidden.new_empty((0, vocab), dtype=torch.float32)
        return ModelOutput(logits, self._prompt_logprobs(hidden, inputs) if inputs.prompt_spans else {}, hidden)

    def _program_hidden(self, inputs: StepInputs) -> torch.Tensor | None:
        """The final hidden states through the decode program, or None where the step is not one for it."""
        meta = inputs.meta
        if (self._program_reason is not None or meta.single_prompt_rows
                or not all(n == 1 for n in meta.query_lens_host)):
            return None
        if self.decode_program is None:
            self.decode_program = DecodeProgram(self.model, self.kv_caches, *self._program_size, self.block_size)
        if not self.decode_program.accepts(meta):
            return None
        return self.decode_program.forward(inputs.input_ids, inputs.positions, meta)

    def _prompt_logprobs(self, hidden: torch.Tensor, inputs: StepInputs) -> dict[int, list[PromptTokenLogprob]]:
        max_k = max(span.k for span in inputs.prompt_spans)
        scored = score_prompt_rows(self.model.compute_logits, hidden[inputs.prompt_rows], inputs.prompt_targets,
                                   self.model.config.vocab_size, max_k)
        out: dict[int, list[PromptTokenLogprob]] = {}
        for span in inputs.prompt_spans:
            entries = scored[span.first_row:span.first_row + span.count]
            if span.k < max_k:
                for e in entries:
                    e.top = e.top[:span.k]
            out[span.batch_index] = entries
        return out


def _metadata_tensors(slots: list[int], tables: list[list[int]], context_lens: list[int],
                      query_lens: list[int]) -> list[torch.Tensor]:
    """Attention metadata's tensors on the host, from one slot per token and one table, context length and query
    length per attention row: slot_mapping, block_tables (padded with block 0), context_lens, query_start_loc."""
    max_blocks = max(len(table) for table in tables)
    query_start = [0]
    for n in query_lens:
        query_start.append(query_start[-1] + n)
    return [torch.tensor(slots, dtype=torch.int64),
            torch.tensor([table + [0] * (max_blocks - len(table)) for table in tables], dtype=torch.int32),
            torch.tensor(context_lens, dtype=torch.int32),
            torch.tensor(query_start, dtype=torch.int32)]

"""Decode steps replayed from CUDA graphs.

On a GPU a decode step of a small model is bound by the host, not the device: Qwen3-0.6B's forward is a few
hundred small kernels, each launched from Python, and the GPU finishes each before the next is issued.
Captured once as a CUDA graph, the whole forward (and the output head) is one replay.

A graph fixes its shapes, so steps are padded to a ladder of captured shapes, keyed (rows, width):
- rows: the batch pads to the next size of `batch_sizes`. A padded row decodes token 0 at position 0 over
  one slot of the scratch block (the KV cache's spare block, which the block manager never hands out), so
  its K/V write and its attention touch nothing a sequence owns.
- width: the block tables pad to the next width of `table_widths` (in blocks), the padding pointing at the
  scratch block. The attention kernels read each row's own context length from the device; the width only
  bounds it (AttentionMetadata.lengths_are_bounds), so one graph serves every length up to its width.

Each graph owns its inputs: one packed int64 device buffer (worker/runner/step_transfer.py's layout). A step writes
its padded values straight into a pinned host buffer of the same layout (numpy views: no per-field tensors) and
sends it with one non-blocking copy into that buffer, then replays. The graph ends by copying its logits into one [max rows, vocab] float32 buffer
shared by every graph (they replay one at a time; the sampler reads a step's logits before the next step
replays). The smallest shape is captured when the graphs are made, every other when a step first needs it or
when capture_all() runs (a server's startup); all share one memory pool. Prefill and mixed steps, and decode steps that score prompt tokens, run eagerly. A capture that fails
raises CaptureFailed; the model runner then runs every step eagerly and says why.

`capture=False` runs the same padded path without capturing: the CPU tests check the padding with it, and on a
GPU it tells a capture problem from a padding one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from worker.attention.metadata import AttentionMetadata
from worker.core.scheduler import ScheduledBatch
from worker.model.decoder import DecoderForCausalLM
from worker.runner.prompt_logprobs import prompt_rows_to_score
from worker.runner.step_transfer import Field, layout

log = logging.getLogger(__name__)

# Rows per captured graph: fine steps where a batch is small (each padded row costs a whole row's work),
# then steps of 16.
_SMALL_SIZES = (1, 2, 4, 8)
_SIZE_STEP = 16
# Block-table widths, doubling from 8 blocks (128 tokens at 16-token blocks): attention work grows with the
# width for the torch reference (it attends over the whole width, masked), so widths stay near the contexts.
_FIRST_WIDTH = 8


def batch_sizes(max_rows: int) -> tuple[int, ...]:
    """The captured row counts up to max_rows, max_rows itself always last."""
    sizes = [s for s in _SMALL_SIZES if s < max_rows] + list(range(_SIZE_STEP, max_rows, _SIZE_STEP))
    return tuple(sorted(set(sizes))) + (max_rows,)


def table_widths(max_blocks: int) -> tuple[int, ...]:
    """The captured block-table widths up to max_blocks, max_blocks itself always last."""
    widths, w = [], _FIRST_WIDTH
    while w < max_blocks:
        widths.append(w)
        w *= 2
    return tuple(widths) + (max_blocks,)


class CaptureFailed(RuntimeError):
    """A shape could not be captured (an operation CUDA graphs cannot hold, or a kernel that synchronises)."""


def _ceil_to(value: int, ladder: tuple[int, ...]) -> int:
    return next(v for v in ladder if v >= value)


@dataclass
class DecodeGraph:
    """One captured shape: its input buffer and, once captured, the graph."""

    rows: int
    width: int
    buffer: torch.Tensor  # [units] int64 on the device: every input of the graph, packed
    fields: list[Field]
    graph: torch.cuda.CUDAGraph | None = None

    def inputs(self) -> list[torch.Tensor]:
        """Views of the buffer: input ids [rows] int64, positions [rows] int64, slots [rows] int64,
        block tables [rows, width] int32, context lengths [rows] int32, query starts [rows + 1] int32."""
        return [f.view(self.buffer) for f in self.fields]


@dataclass(frozen=True)
class GraphStep:
    """A decode step bound to a graph whose buffer already holds (or is being sent) the step's inputs."""

    graph: DecodeGraph
    num_rows: int  # the step's real rows; the graph's others are padding

    @property
    def sampling_rows(self) -> list[int]:
        """Every row samples (StepInputs' field of the same name: batch index of each logits row)."""
        return list(range(self.num_rows))


class DecodeGraphs:
    def __init__(self, model: DecoderForCausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 block_size: int, scratch_block: int, max_rows: int, max_blocks: int, capture: bool = True):
        """scratch_block: a cache block no sequence ever holds; max_rows, max_blocks: the largest batch and
        block table a decode step can have (max_num_seqs, max_model_len in blocks)."""
        if not model.backend.capturable_decode:
            raise ValueError(f"the {model.backend.name} attention backend cannot plan a step from bounds")
        self.model, self.kv_caches, self.block_size = model, kv_caches, block_size
        self.scratch_block = scratch_block
        self.device = kv_caches[0][0].device
        self.capture = capture
        self.sizes, self.widths = batch_sizes(max_rows), table_widths(max_blocks)
        self._graphs: dict[tuple[int, int], DecodeGraph] = {}
        self._pool = None  # the graphs' shared memory pool, made by the first capture
        with torch.inference_mode():
            self._logits = torch.empty(max_rows, model.config.vocab_size, dtype=torch.float32, device=self.device)
            if capture:  # the smallest shape at once: a model that cannot be captured is known at startup
                self._graph(self.sizes[0], self.widths[0])

    def capture_all(self) -> int:
        """Captures every shape of the ladders not captured yet, largest first (so the shared pool grows once and
        the smaller graphs reuse its memory); returns how many it captured. A server does this at startup, so
        that no request waits for a capture; without it each shape is captured when a step first needs it."""
        if not self.capture:
            return 0
        missing = [(rows, width) for rows in reversed(self.sizes) for width in reversed(self.widths)
                   if (rows, width) not in self._graphs]
        with torch.inference_mode():
            for rows, width in missing:
                self._graph(rows, width)
        return len(missing)

    @property
    def num_captured(self) -> int:
        return sum(g.graph is not None for g in self._graphs.values())

    def describe(self) -> str:
        return (f"{'captured' if self.capture else 'eager (not captured)'}, rows {','.join(map(str, self.sizes))}; "
                f"block-table widths {','.join(map(str, self.widths))}")

    @torch.inference_mode()
    def prepare(self, batch: ScheduledBatch) -> GraphStep | None:
        """The step bound to its graph with its inputs sent, or None where the step is not one for a graph
        (some sequence prefills, does not sample, or scores prompt tokens)."""
        seqs = batch.seqs
        if len(seqs) > self.sizes[-1] or any(n != 1 for n in batch.num_new_tokens):
            return None
        bs = self.block_size
        ids, positions, slots, lens = [], [], [], []
        for seq in seqs:
            p = seq.num_computed_tokens  # the new token's position
            if p + 1 != seq.num_tokens or seq.num_output_tokens >= seq.max_tokens \
                    or prompt_rows_to_score(seq, p, p + 1):
                return None
            ids.append(seq.token_ids[p])
            positions.append(p)
            slots.append(seq.block_table[p // bs] * bs + p % bs)
            lens.append(p + 1)
        width = _ceil_to(-(-max(lens) // bs), self.widths)
        graph = self._graph(_ceil_to(len(seqs), self.sizes), width)
        self._send(graph, ids, positions, slots, [seq.block_table[:width] for seq in seqs], lens)
        return GraphStep(graph, len(seqs))

    @torch.inference_mode()
    def run(self, step: GraphStep) -> torch.Tensor:
        """The step's logits [num_rows, vocab] float32 (a view of the shared buffer: valid until the next
        step runs)."""
        graph = step.graph
        if graph.graph is not None:
            graph.graph.replay()
        else:
            self._forward(graph)
        return self._logits[:step.num_rows]

    def _send(self, graph: DecodeGraph, ids: list[int], positions: list[int], slots: list[int],
              tables: list[list[int]], lens: list[int]) -> None:
        """Writes the step's rows, padded to the graph's, straight into a host buffer laid out as the graph's
        (pinned on CUDA), and copies it into the graph's buffer with one non-blocking copy. tables: each row's
        block ids, at most the graph's width (the rest of a row points at the scratch block)."""
        host = torch.empty(graph.buffer.shape, dtype=torch.int64, pin_memory=self.device.type == "cuda")
        ids_h, positions_h, slots_h, tables_h, lens_h, starts_h = (f.view(host).numpy() for f in graph.fields)
        n = len(ids)
        ids_h[:n], ids_h[n:] = ids, 0  # padded rows decode token 0 at position 0 ...
        positions_h[:n], positions_h[n:] = positions, 0
        slots_h[:n], slots_h[n:] = slots, self.scratch_block * self.block_size  # ... into the scratch block's slot 0
        tables_h.fill(self.scratch_block)
        for row, table in zip(tables_h, tables):
            row[:len(table)] = table
        lens_h[:n], lens_h[n:] = lens, 1
        starts_h[:] = np.arange(graph.rows + 1)  # one query row per sequence
        graph.buffer.copy_(host, non_blocking=True)

    def _graph(self, rows: int, width: int) -> DecodeGraph:
        key = (rows, width)
        if key not in self._graphs:
            shapes = [torch.empty(rows, dtype=torch.int64)] * 3 + [torch.empty(rows, width, dtype=torch.int32),
                                                                   torch.empty(rows, dtype=torch.int32),
                                                                   torch.empty(rows + 1, dtype=torch.int32)]
            fields, units = layout(shapes)
            graph = DecodeGraph(rows, width, torch.empty(units, dtype=torch.int64, device=self.device), fields)
            if self.capture:
                try:
                    self._capture(graph)
                except Exception as e:
                    raise CaptureFailed(f"capturing the {rows}-row decode step with {width}-block tables: "
                                        f"{type(e).__name__}: {e}") from e
            self._graphs[key] = graph
        return self._graphs[key]

    def _forward(self, graph: DecodeGraph) -> None:
        """The model over the graph's buffer, logits into the shared buffer: what a graph captures."""
        ids, positions, slots, tables, lens, starts = graph.inputs()
        meta = AttentionMetadata(
            slot_mapping=slots, block_tables=tables, context_lens=lens, query_start_loc=starts,
            context_lens_host=(graph.width * self.block_size,) * graph.rows, query_lens_host=(1,) * graph.rows,
            block_size=self.block_size, lengths_are_bounds=True)
        hidden = self.model(ids, positions, self.kv_caches, meta)  # [rows, hidden]
        self._logits[:graph.rows].copy_(self.model.compute_logits(hidden))

    def _capture(self, graph: DecodeGraph) -> None:
        """Warms the shape up once outside the capture (lazy initialisations: cuBLAS workspaces, kernel loads),
        then captures it. Both run on padding rows only, which write the scratch block alone."""
        self._send(graph, [], [], [], [], [])
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            self._forward(graph)
        current.wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        cuda_graph = torch.cuda.CUDAGraph()
        # thread_local: another thread of the worker (the request reader, the output sender) touching CUDA by
        # accident would otherwise invalidate the capture; those threads never do, and this says so.
        with torch.cuda.graph(cuda_graph, pool=self._pool, capture_error_mode="thread_local"):
            self._forward(graph)
        graph.graph = cuda_graph
        log.info("captured the decode step for %d rows, block tables %d wide (%d graphs)", graph.rows, graph.width,
                 len(self._graphs) + 1)

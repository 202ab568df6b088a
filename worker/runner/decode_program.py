"""A quantized model's decode steps: every decoder layer as one prebuilt kernel program.

Through the modules, a decode step of the default model makes about 300 kernel launches from Python
(per layer: norms, four matmuls of two phases each, rotary + KV write, attention, silu), and each one
checks its operands, allocates its output and scratch and packs its parameters: at batch 1 that costs
more than the matmuls. For steps where every row decodes one token, this runs the same kernels with the
same parameters, so the same bits, as one OpenMP program (kernels/omp_program.py): the buffers (sized for
the largest batch) and every phase's parameters are made once, by the kernels' own checked entry points;
a step copies its inputs into the fixed buffers, checks their ranges, patches the row count, and makes
one call. Embedding, head and sampler stay outside.
"""

from __future__ import annotations

import torch

from kernels import attention as mojo_attention
from kernels import layers as mojo_layers
from kernels.omp_program import Program, ProgramBuilder
from kernels.quant_matmul import use_amx
from worker.attention.metadata import AttentionMetadata
from worker.attention.mojo_cpu import MojoAttentionBackend
from worker.model.decoder import DecoderForCausalLM
from worker.model.layer_ops import MojoLayerOps
from worker.quant.linear import QuantLinear

# Per-step values patched into the program: rows (decode rows), items (rows x KV heads: attention's work
# items), amx (whether the matmuls compute on AMX tiles at this row count; the same bits either way).
VALUES = ("rows", "items", "amx")


def unsupported_reason(model: DecoderForCausalLM) -> str | None:
    """Why this model's decode steps cannot run as a program, or None when they can."""
    if not isinstance(model.backend, MojoAttentionBackend) or not isinstance(model.ops, MojoLayerOps):
        return "the Mojo attention and layer kernels are not in use"
    if mojo_attention.omp_team() is None:
        return "the OpenMP bridge is unavailable"
    for layer in model.layers:
        for proj in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            if not isinstance(proj, QuantLinear):
                return "the projections are not quantized"
    return None


class DecodeProgram:
    def __init__(self, model: DecoderForCausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 max_rows: int, max_blocks_per_seq: int, block_size: int):
        """Buffers for up to max_rows decode rows, block tables up to max_blocks_per_seq wide."""
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"decode steps cannot run as a program: {reason}")
        cfg = model.config
        self.model, self.max_rows, self.max_blocks = model, max_rows, max_blocks_per_seq
        self.block_size, self.kv_heads = block_size, cfg.num_kv_heads
        self.max_positions = model.rotary.cos.shape[0]
        self._k_cache = kv_caches[0][0]
        dtype = model.norm.weight.dtype  # the activations' (an int8 KV cache is not)
        self.steps_run = 0
        self._values = (0, 0, 0)  # the last step's per-step values (rows, items, amx)

        def buffer(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dt)

        rows, hidden = max_rows, cfg.hidden_size
        attn0, mlp0 = model.layers[0].self_attn, model.layers[0].mlp
        # The residual stream (the embeddings first), each layer's MLP output and the final norm's output.
        self._residual, self._mlp_out, self._final = buffer(rows, hidden), buffer(rows, hidden), buffer(rows, hidden)
        self._h = buffer(rows, hidden)  # the norms' outputs, the matmuls' inputs
        self._qkv = buffer(rows, attn0.qkv_proj.out_features)
        self._q = buffer(rows, cfg.num_heads, cfg.head_dim)
        self._attn = buffer(rows, cfg.num_heads, cfg.head_dim)
        self._o = buffer(rows, hidden)
        self._gate_up = buffer(rows, mlp0.gate_up_proj.out_features)
        self._act = buffer(rows, mlp0.gate_up_proj.out_features // 2)
        projections = [p for layer in model.layers for p in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                              layer.mlp.gate_up_proj, layer.mlp.down_proj)]
        # One scratch serves every matmul: phases never overlap a matmul's use of it (barriers).
        self._mm_scratch = buffer(max(p.scratch_bytes(rows) for p in projections), dt=torch.uint8)
        self._rope_scratch = mojo_layers.rope_scratch(rows, cfg.head_dim)
        self._attn_scratch = mojo_attention.attention_scratch(rows * self.kv_heads, self._k_cache,
                                                               prompt_rows=False)  # decode rows only
        # The step's inputs, at fixed addresses: a plan for max_rows decode rows, refilled every step.
        self._positions = buffer(rows, dt=torch.int64)
        self._plan = mojo_attention.StepPlan.build(buffer(rows, max_blocks_per_seq, dt=torch.int32), (1,) * rows,
                                             (1,) * rows, buffer(rows, dt=torch.int64), block_size, max_query_len=1,
                                             balanced=False)
        self._np = {name: t.numpy() for name, t in (("positions", self._positions), ("slots", self._plan.slot_mapping),
                                                   ("context_lens", self._plan.context_lens),
                                                   ("tables", self._plan.block_tables))}
        self._program = self._build(kv_caches)

    @property
    def n_phases(self) -> int:
        return self._program.n_phases

    def accepts(self, meta: AttentionMetadata) -> bool:
        """Whether a step runs as this program: every row decodes one token, and the batch and its block
        tables fit the buffers."""
        lens = meta.query_lens_host
        return (0 < len(lens) <= self.max_rows and meta.block_tables.shape[1] <= self.max_blocks
                and meta.block_size == self.block_size and all(n == 1 for n in lens) and not meta.single_prompt_rows)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: [rows] of a step `accepts` takes -> the final hidden states [rows, hidden],
        the model forward's bits, in a buffer the next step overwrites."""
        rows = input_ids.shape[0]
        mojo_layers.check_positions(positions, self.max_positions)
        self._load_inputs(positions, meta)
        self._residual[:rows].copy_(self.model.embed_tokens(input_ids))
        self._values = (rows, rows * self.kv_heads, int(use_amx(rows)))
        self._program.run(*self._values)
        self.steps_run += 1
        return self._final[:rows]

    def time_last_step(self) -> list[tuple[str, float]]:
        """The last step's phases again, each run alone (Program.time_phases): (kernel entry, seconds) in order.
        For profiling only: the step's KV rows are written again from what the phases compute now."""
        return list(zip(self._program.labels, self._program.time_phases(*self._values)))

    def _load_inputs(self, positions: torch.Tensor, meta: AttentionMetadata) -> None:
        """Copies the step's positions, slots, context lengths and block tables into the program's buffers,
        then checks what the kernels will follow, as the module path's plan does."""
        rows, width = meta.block_tables.shape
        arrays = self._np
        arrays["positions"][:rows] = positions.numpy()
        arrays["slots"][:rows] = meta.slot_mapping.numpy()
        lens = arrays["context_lens"][:rows]
        lens[:] = meta.context_lens.numpy()
        arrays["tables"][:rows, :width] = meta.block_tables.numpy()
        plan = self._plan
        if lens.min() < 1 or -(-int(lens.max()) // self.block_size) > width:
            raise ValueError("decode program: a context is empty or longer than its block table")
        plan.min_slot, plan.max_slot = int(arrays["slots"][:rows].min()), int(arrays["slots"][:rows].max())
        # Columns beyond `width` hold earlier steps' entries; no context reaches them.
        plan.min_block_id, plan.max_block_id = mojo_attention.table_range(arrays["tables"][:rows, :width], lens,
                                                                    self.block_size)
        mojo_attention.check_slots(plan, self._k_cache)
        mojo_attention.check_block_ids(plan, self._k_cache)

    def _build(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> Program:
        """Every layer's phases, in the order DecoderLayer.forward runs them, then the final norm."""
        model, rows = self.model, self.max_rows
        builder = ProgramBuilder(mojo_attention.omp_team(), VALUES)
        layers_module, attention_module = model.ops.kernel_module, model.backend.kernel_module
        q_size = self._q.shape[1] * self._q.shape[2]

        def norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
                 out: torch.Tensor) -> None:
            params = mojo_layers.rms_norm_params(x, weight, eps, residual, out)
            builder.add(layers_module, "mili_rms_norm_range", params, "rows", {mojo_layers.RMS_NORM_ROWS_PARAM: "rows"})

        def matmul(proj: QuantLinear, x: torch.Tensor, out: torch.Tensor, after_row_phase: bool = True) -> None:
            calls = proj.prebuilt(x, out, self._mm_scratch)  # one per block type, each on its own columns
            # Quantizing row r reads only row r of x: after a norm or silu (one item per row), the same thread
            # wrote it, so no barrier is needed. The first call's quantized rows serve every call's tiles
            # (prebuilt checks they share them); each tile phase waits for the whole quantize phase.
            first = calls[0]
            builder.add(first.module, first.entries[0], first.params, "rows", first.patches(),
                        same_split=after_row_phase)
            for call in calls:
                builder.add(call.module, call.entries[1], call.params, call.tiles, call.patches(), taken=True)

        for i, (layer, (k_cache, v_cache)) in enumerate(zip(model.layers, kv_caches)):
            attn, mlp = layer.self_attn, layer.mlp
            norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
            if i == 0:  # the embeddings are the residual stream; no add before the first norm
                norm(self._residual, norm1.weight, norm1.eps, None, self._h)
            else:
                norm(self._mlp_out, norm1.weight, norm1.eps, self._residual, self._h)
            matmul(attn.qkv_proj, self._h, self._qkv)
            q_norm, k_norm = (attn.q_norm.weight, attn.k_norm.weight) if attn.qk_norm else (None, None)
            params = mojo_layers.rope_write_kv_params(
                self._qkv, self._positions, model.rotary.cos, model.rotary.sin_signed, k_cache, v_cache, self._plan,
                attn.num_heads, q_norm, k_norm, attn.q_norm.eps if attn.qk_norm else 0.0, self._q, self._rope_scratch)
            builder.add(layers_module, "mili_rope_write_kv_range", params, "rows",
                        {mojo_layers.ROPE_TOKENS_PARAM: "rows"})
            params = mojo_attention.attention_params(self._q, k_cache, v_cache, self._plan, attn.scale, self._attn,
                                               self._attn_scratch)
            builder.add(attention_module, "mili_paged_attention_range", params, "items",
                        {mojo_attention.ATTENTION_ITEMS_PARAM: "items"}, taken=True)
            matmul(attn.o_proj, self._attn.view(rows, q_size), self._o, after_row_phase=False)
            norm(self._o, norm2.weight, norm2.eps, self._residual, self._h)
            matmul(mlp.gate_up_proj, self._h, self._gate_up)
            params = mojo_layers.silu_mul_params(self._gate_up, self._act)
            builder.add(layers_module, "mili_silu_mul_range", params, "rows", {mojo_layers.SILU_MUL_ROWS_PARAM: "rows"})
            matmul(mlp.down_proj, self._act, self._mlp_out)
        norm(self._mlp_out, model.norm.weight, model.norm.eps, self._residual, self._final)
        return builder.build()



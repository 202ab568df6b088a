"""One decoder-only transformer that covers Qwen3, Qwen2 and Llama checkpoints.

The three differ only in flags on ModelConfig: Qwen2 adds q/k/v biases (Llama and Qwen3 with attention_bias add
them and an output-projection bias; Llama's mlp_bias adds gate, up and down biases), Qwen3 adds per-head RMSNorm
on q and k (and may set head_dim != hidden / heads), and any may scale its rotary frequencies
(worker/model/rotary.py). Projections
are fused (q|k|v, gate|up) so each layer runs four matmuls; the weight loader fills the fused
tensors from the checkpoint's separate ones.

The model sees the step's tokens flattened: [num_tokens] ids and positions, attention metadata
describing which sequence each token belongs to, and per-layer paged K/V caches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from worker.attention.metadata import AttentionBackend, AttentionMetadata
from worker.checkpoint.model_config import ModelConfig
from worker.model.layer_ops import LayerOps, TorchLayerOps
from worker.model.layers import RMSNorm
from worker.model.rotary import RotaryEmbedding
from worker.model.packed_linear import PackedLinear, pack_linears
from worker.model.step_context import OutputRows, RowStep, StepContext
from worker.quant.linear import BlockEmbedding, QuantLinear, module_for, project, repack_for_kernel
from worker.quant.row_modes import PromptPositions
from worker.quant.sources import HEAD


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, ops: LayerOps, **factory):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias, **factory)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias, **factory)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, **factory)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, **factory)
        self.qk_norm = cfg.qk_norm
        self.scale = cfg.head_dim ** -0.5
        self.backend = backend
        self.ops = ops

    def forward(self, x: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], step: StepContext,
                rows: RowStep | None = None) -> torch.Tensor:
        """x: [num_tokens, hidden] -> [num_tokens, hidden], or [len(rows.index), hidden] for just those rows (every
        row's K and V are cached either way)."""
        qkv = project(self.qkv_proj, x, step.prompt_positions)  # [num_tokens, q_size + 2 * kv_size]
        q = self.ops.qkv_to_cache(self, qkv, kv_cache, step)  # [num_tokens, heads, head_dim]; K, V cached
        if rows is not None:
            if rows.index.numel() == 0:
                return x.new_empty((0, x.shape[1]))
            q, step = q[rows.index], rows.step  # [num_out, heads, head_dim]
        k_cache, v_cache = kv_cache
        out = self.backend.attend(q, k_cache, v_cache, step.meta, step.plan, self.scale)  # [rows, heads, dim]
        return project(self.o_proj, out.reshape(q.shape[0], self.q_size), step.prompt_positions)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: LayerOps, **factory):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias, **factory)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias, **factory)
        self.ops = ops

    def forward(self, x: torch.Tensor, prompt_positions: PromptPositions | None = None) -> torch.Tensor:
        gate_up = project(self.gate_up_proj, x, prompt_positions)  # [num_tokens, 2 * intermediate]
        return project(self.down_proj, self.ops.silu_mul(gate_up), prompt_positions)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, ops: LayerOps, **factory):
        super().__init__()
        self.self_attn = Attention(cfg, backend, ops, **factory)
        self.mlp = MLP(cfg, ops, **factory)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)
        self.ops = ops

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, kv_cache,
                step: StepContext, rows: RowStep | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's MLP output (the embeddings, with residual None, for the first layer).
        Returns this layer's MLP output and the residual stream before it; the next layer adds them,
        fused into its first norm: transformers' `x = x + sublayer(norm(x))`, twice, rounded alike.
        With `rows`, both for those rows only."""
        norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
        if residual is None:
            residual, h = x, self.ops.rms_norm(x, norm1.weight, norm1.eps)
        else:
            h, residual = self.ops.add_rms_norm(x, residual, norm1.weight, norm1.eps)
        attended = self.self_attn(h, kv_cache, step, rows)
        if rows is not None:
            residual = residual[rows.index]
            if attended.shape[0] == 0:  # no row is read past the cache
                return attended, residual
        h, residual = self.ops.add_rms_norm(attended, residual, norm2.weight, norm2.eps)
        return self.mlp(h, (step if rows is None else rows.step).prompt_positions), residual


class DecoderForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: AttentionBackend, max_positions: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu",
                 rotary_device: torch.device | str = "cpu", ops: LayerOps | None = None):
        """`device="meta"` builds the module without allocating weights (the loader materializes them)."""
        super().__init__()
        factory = {"dtype": dtype, "device": device}
        self.config = cfg
        self.backend = backend
        self.ops = ops = ops or TorchLayerOps(backend)
        # Not a submodule: its tables are computed, not loaded, and must survive to_empty().
        self.rotary = RotaryEmbedding(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling,
                                      device=rotary_device)
        # Given its (empty) weight, nn.Embedding skips its random init, which on the meta device goes
        # through torch._refs and imports torch._dynamo and sympy: tens of MiB resident, for nothing.
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         _weight=torch.empty(cfg.vocab_size, cfg.hidden_size, **factory))
        self.layers = nn.ModuleList(DecoderLayer(cfg, backend, ops, **factory) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **factory)
        if cfg.num_labels:  # a sequence classifier: its head scores the last token; it has no LM head
            self.score = nn.Linear(cfg.hidden_size, cfg.num_labels, bias=False, **factory)
        elif not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, **factory)
        self._packed_head: PackedLinear | None = None
        self._quant_head: QuantLinear | None = None

    def use_quantized(self, plan) -> set[str]:
        """On the meta-device model, before loading: swaps the planned projections for QuantLinear
        modules (and the embedding for a BlockEmbedding). Returns the parameter names the checkpoint
        no longer fills. The blocks themselves come in load_quantized."""
        skipped = set()
        for name in [*plan.matrices, *plan.mixed]:
            if name == HEAD:
                self._quant_head = QuantLinear(self.config.hidden_size, self.config.vocab_size, False,
                                               self.embed_tokens.weight.dtype, out_dtype=torch.float32,
                                               activations=plan.activations)
                if not self.config.tie_word_embeddings:
                    del self.lm_head
                    skipped.add("lm_head.weight")
                continue
            parent_name, _, child = name.rpartition(".")
            parent, linear = self.get_submodule(parent_name), self.get_submodule(name)
            setattr(parent, child, QuantLinear(linear.in_features, linear.out_features, linear.bias is not None,
                                               linear.weight.dtype, activations=plan.activations))
            skipped.add(f"{name}.weight")
        if plan.embedding is not None:
            qtype, raw, keep_alive = plan.embedding
            self.embed_tokens = BlockEmbedding(raw, qtype, self.embed_tokens.weight.dtype, keep_alive)
            skipped.add("embed_tokens.weight")
        return skipped

    def load_quantized(self, plan) -> None:
        """Repacks each planned matrix's blocks into the kernel's tiles (one matrix at a time)."""
        for name, (qtype, load_rows) in plan.matrices.items():
            target = self._quant_head if name == HEAD else self.get_submodule(name)
            raw = load_rows()
            if raw.shape[0] != target.out_features:
                raise ValueError(f"quantized {name} has {raw.shape[0]} rows, expected {target.out_features}")
            target.set_weight(repack_for_kernel(raw, qtype), qtype, module_for(qtype))
            target.finish_loading()
        for name, runs in plan.mixed.items():
            target = self.get_submodule(name)
            segments = []
            for qtype, load_rows in runs:
                raw = load_rows()
                segments.append((qtype, repack_for_kernel(raw, qtype), raw.shape[0], module_for(qtype)))
            target.set_segments(segments)  # checks that the rows add up
            target.finish_loading()

    def pack_linear_weights(self, batch_hint: int, head: bool = True) -> None:
        """Reorders every projection, and the output head, into oneDNN's layout (see packed_linear).
        A tied head gets its own packed copy: the embedding lookup still needs the plain rows.
        Quantized projections and heads are not nn.Linear and stay as they are. head=False: the model never
        computes logits (an embedding model), so it gets no packed copy and an untied head is dropped."""
        if head and self._quant_head is None and not self.config.num_labels:
            weight = self.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight
            self._packed_head = PackedLinear(weight, None, batch_hint)
        pack_linears(self.layers, batch_hint)
        if not self.config.tie_word_embeddings and hasattr(self, "lm_head"):
            del self.lm_head

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                outputs: OutputRows | None = None, prompt_positions: PromptPositions | None = None) -> torch.Tensor:
        """input_ids, positions: [num_tokens] -> final hidden states [num_tokens, hidden], or with `outputs` those
        rows' alone, [len(outputs.index), hidden] (see OutputRows). prompt_positions: which rows are prompt positions
        (worker/quant/row_modes.py), where the projections run them apart."""
        x = self.embed_tokens(input_ids)
        self.ops.check_step(positions, self.rotary.cos.shape[0])
        step = StepContext(meta, self.backend.plan(meta), positions, self.rotary, x.dtype, prompt_positions)
        residual = None
        last = len(self.layers) - 1
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches)):
            rows = None
            if i == last and outputs is not None:
                row_step = step if outputs.index.numel() == 0 else StepContext(
                    outputs.meta, self.backend.plan(outputs.meta), positions[outputs.index], self.rotary, x.dtype,
                    outputs.prompt_positions)
                rows = RowStep(outputs.index, row_step)
            x, residual = layer(x, residual, kv_cache, step, rows)
        if x.shape[0] == 0:  # no row is read: the step only filled the cache
            return x
        return self.ops.add_rms_norm(x, residual, self.norm.weight, self.norm.eps)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[num_sampled, hidden] -> [num_sampled, vocab] float32."""
        if self._quant_head is not None:
            return self._quant_head(hidden)
        if self._packed_head is not None:
            return self._packed_head(hidden).float()
        weight = self.embed_tokens.weight if self.config.tie_word_embeddings else self.lm_head.weight
        return F.linear(hidden, weight).float()

"""The operations a decoder layer runs around its matmuls and attention, in two implementations (a third,
torch.compile's fusion of the first for CUDA, is worker/model/compiled_ops.py; worker/model/ops_selection.py picks).

`TorchLayerOps` is the reference: torch operators in transformers' order (the oracle path, and the
one used wherever the Mojo kernels are not). `MojoLayerOps` runs the same math as three fused Mojo
kernels per half-layer (kernels/layers.mojo), cutting a layer from about 30 operator calls to 9; it
comes with the Mojo attention backend, whose per-step plan carries the checked cache slots.

All keep the residual stream the way the fused kernel wants it: `add_rms_norm(x, residual)` returns
the norm of residual + x and the new residual.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from worker.attention.metadata import AttentionBackend
from worker.model.layers import RMSNorm, rms_norm
from worker.model.rotary import apply_rotary
from worker.model.step_context import StepContext


class AttentionShape(Protocol):
    """What the ops read of a layer's attention module (worker/model/decoder.py's Attention)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    q_size: int  # num_heads * head_dim
    kv_size: int  # num_kv_heads * head_dim
    qk_norm: bool  # Qwen3's per-head RMSNorm on q and k: q_norm and k_norm exist only then
    q_norm: RMSNorm
    k_norm: RMSNorm


class TorchLayerOps:
    name = "torch"

    def __init__(self, backend: AttentionBackend):
        self.backend = backend

    def check_step(self, positions: torch.Tensor, max_positions: int) -> None:
        pass  # indexing the rotary tables checks positions itself

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        residual = residual + x
        return self.rms_norm(residual, weight, eps), residual

    def qkv_to_cache(self, attn: AttentionShape, qkv: torch.Tensor, kv_cache, step: StepContext) -> torch.Tensor:
        """qkv: [tokens, q_size + 2 * kv_size] -> q: [tokens, heads, head_dim]; K and V go into the cache."""
        tokens = qkv.shape[0]
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q = q.view(tokens, attn.num_heads, attn.head_dim)
        k = k.view(tokens, attn.num_kv_heads, attn.head_dim)
        v = v.view(tokens, attn.num_kv_heads, attn.head_dim)
        if attn.qk_norm:
            q = self.rms_norm(q, attn.q_norm.weight, attn.q_norm.eps)
            k = self.rms_norm(k, attn.k_norm.weight, attn.k_norm.eps)
        cos, sin_signed = step.rotary_tables()
        q, k = apply_rotary(q, cos, sin_signed), apply_rotary(k, cos, sin_signed)
        k_cache, v_cache = kv_cache
        self.backend.write_kv(k_cache, v_cache, k, v, step.meta, step.plan)
        return q

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[tokens, 2 * inter] (gate, then up) -> [tokens, inter]."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)


class MojoLayerOps:
    """The fused kernels. Calls of at least OMP_MIN_ROWS rows split their rows over torch's OpenMP team,
    as the decode attention does (see MojoAttentionBackend); smaller ones stay on the calling thread."""

    name = "mojo"

    def __init__(self):
        from kernels import layers as mojo_layers
        self._ops = mojo_layers
        self._module = mojo_layers.load()

    @property
    def kernel_module(self):
        """The kernels' extension module (worker/runner/decode_program.py enters its kernels directly)."""
        return self._module

    def check_step(self, positions: torch.Tensor, max_positions: int) -> None:
        self._ops.check_positions(positions, max_positions)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._ops.rms_norm(self._module, x, weight, eps, threading=_threading(x.shape[0]))

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        # The residual stream is this forward's own tensor (the embedding output, updated in place since).
        out = self._ops.rms_norm(self._module, x, weight, eps, residual=residual, threading=_threading(x.shape[0]))
        return out, residual

    def qkv_to_cache(self, attn: AttentionShape, qkv: torch.Tensor, kv_cache, step: StepContext) -> torch.Tensor:
        k_cache, v_cache = kv_cache
        rotary = step.rotary
        return self._ops.rope_write_kv(
            self._module, qkv, step.positions, rotary.cos, rotary.sin_signed, k_cache, v_cache, step.plan.kernel,
            attn.num_heads, attn.q_norm.weight if attn.qk_norm else None,
            attn.k_norm.weight if attn.qk_norm else None, attn.q_norm.eps if attn.qk_norm else 0.0,
            threading=_threading(qkv.shape[0]))

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._ops.silu_mul(self._module, gate_up, threading=_threading(gate_up.shape[0]))


# Prefill-sized calls gain from the second core (a 512-token prefill step: about 150 ms instead of 163);
# decode-sized ones measured the same either way (loadtest/profile_step.py), so they skip the hand-off.
OMP_MIN_ROWS = 64


def _threading(rows: int) -> str:
    return "omp" if rows >= OMP_MIN_ROWS else "caller"


LayerOps = TorchLayerOps | MojoLayerOps

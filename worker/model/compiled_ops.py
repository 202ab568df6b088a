"""TorchLayerOps' math with each run of elementwise operators fused into one kernel by torch.compile.

On a GPU a small model's decode step is mostly tiny kernels: eager, a layer runs about 30 of them around its four
matmuls and its attention (norms with their float32 casts, rotary, residual adds, SiLU), each a few microseconds
even inside a CUDA graph. Compiled (Inductor's Triton kernels), the residual add and norm are one kernel, the q/k
norms and rotary one, SiLU-and-multiply one. Same expressions as the reference, and Inductor told to round where
eager rounds (`emulate_precision_casts`), so a result differs from the eager one only by a reduction's order.

Shapes are dynamic in the token count: one compiled kernel serves every batch (plus Dynamo's own specialisation
for one token), compiled on first use, which the decode graphs' warm-up runs before each capture.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from worker.model.layer_ops import AttentionShape, TorchLayerOps
from worker.model.layers import rms_norm
from worker.model.rotary import apply_rotary
from worker.model.step_context import StepContext

# Inductor rounds to the activation dtype between operators as eager torch does (its default keeps float32).
_OPTIONS = {"emulate_precision_casts": True}


def _compile(fn):
    return torch.compile(fn, dynamic=True, fullgraph=True, options=_OPTIONS)


def _add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    residual = residual + x
    return rms_norm(residual, weight, eps), residual


def _norm_rotary(qkv: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor, q_weight: torch.Tensor | None,
                 k_weight: torch.Tensor | None, eps: float, num_heads: int, num_kv_heads: int,
                 head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv: [tokens, (heads + 2 * kv_heads) * head_dim] -> q [tokens, heads, dim] and k [tokens, kv_heads, dim]."""
    tokens = qkv.shape[0]
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q = qkv[:, :q_size].view(tokens, num_heads, head_dim)
    k = qkv[:, q_size:q_size + kv_size].view(tokens, num_kv_heads, head_dim)
    if q_weight is not None:
        q, k = rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps)
    return apply_rotary(q, cos, sin_signed), apply_rotary(k, cos, sin_signed)


def _silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class CompiledLayerOps(TorchLayerOps):
    name = "compiled"

    def __init__(self, backend):
        super().__init__(backend)
        self._rms_norm = _compile(rms_norm)
        self._add_rms_norm = _compile(_add_rms_norm)
        self._norm_rotary = _compile(_norm_rotary)
        self._silu_mul = _compile(_silu_mul)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._rms_norm(x, weight, eps)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return self._add_rms_norm(x, residual, weight, eps)

    def qkv_to_cache(self, attn: AttentionShape, qkv: torch.Tensor, kv_cache, step: StepContext) -> torch.Tensor:
        cos, sin_signed = step.rotary_tables()
        norms = (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps) if attn.qk_norm else (None, None, 0.0)
        q, k = self._norm_rotary(qkv, cos, sin_signed, *norms, attn.num_heads, attn.num_kv_heads, attn.head_dim)
        v = qkv[:, attn.q_size + attn.kv_size:].view(qkv.shape[0], attn.num_kv_heads, attn.head_dim)  # a view
        k_cache, v_cache = kv_cache
        self.backend.write_kv(k_cache, v_cache, k, v, step.meta, step.plan)
        return q

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._silu_mul(gate_up)

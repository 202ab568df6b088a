"""Checked Python entry points to the fused layer kernels (kernels/layers.mojo).

As with the attention kernels, every pointer the kernels will follow is checked here first: dtypes,
shapes, contiguity, and the ranges of cache slots (from the step's attention plan) and positions.
A bad call raises ValueError and never reaches the kernel.
"""

from __future__ import annotations

import array
from types import ModuleType

import torch

from kernels import kv_int8
from kernels.attention import (DTYPE_CODES, THREADINGS, StepPlan, _check_activation_dtype, _check_cache, _require,
                               check_slots, float_bits, kernel_params, launch, load_module)

MODULE = "mili_layers"


def load() -> ModuleType:
    return load_module(MODULE)


def _check_rows(x: torch.Tensor, name: str) -> None:
    _require(x.dim() == 2 and x.is_contiguous(), f"{name} must be a contiguous [rows, dim] tensor")
    _require(x.dtype in DTYPE_CODES, f"{name}: unsupported dtype {x.dtype}")
    _require(x.shape[1] % 8 == 0, f"{name}: row length {x.shape[1]} is not a multiple of 8")


# Each kernel's parameter holding its row (token) count, which a prebuilt call patches per step.
RMS_NORM_ROWS_PARAM, SILU_MUL_ROWS_PARAM, ROPE_TOKENS_PARAM = 4, 2, 10


def rms_norm(module: ModuleType, x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, threading: str = "caller") -> torch.Tensor:
    """x: [rows, dim] -> weight * RMSNorm(x). With `residual` ([rows, dim], updated in place):
    residual += x first, and the norm is of the sum (a decoder layer's residual add fused in).
    threading: as for kernels/attention.py's paged_attention, over rows."""
    _require(threading in THREADINGS, f"threading must be one of {THREADINGS}")
    out = torch.empty_like(x)
    launch(module, "rms_norm", rms_norm_params(x, weight, eps, residual, out), x.shape[0], threading)
    return out


def rms_norm_params(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None,
                    out: torch.Tensor) -> array.array:
    """The checked parameters of rms_norm writing into `out` (contiguous, shaped like x)."""
    _check_rows(x, "x")
    _require(weight.shape == (x.shape[1],) and weight.dtype == x.dtype and weight.is_contiguous(), "bad norm weight")
    if residual is not None:
        _require(residual.shape == x.shape and residual.dtype == x.dtype and residual.is_contiguous(),
                 "residual must be contiguous and shaped like x")
    _require(out.shape == x.shape and out.dtype == x.dtype and out.is_contiguous(), "bad output tensor")
    return kernel_params(out.data_ptr(), x.data_ptr(), 0 if residual is None else residual.data_ptr(),
                         weight.data_ptr(), x.shape[0], x.shape[1], float_bits(eps), DTYPE_CODES[x.dtype])


def silu_mul(module: ModuleType, gate_up: torch.Tensor, threading: str = "caller") -> torch.Tensor:
    """gate_up: [rows, 2 * inter] (gate, then up) -> silu(gate) * up, [rows, inter]."""
    _require(threading in THREADINGS, f"threading must be one of {THREADINGS}")
    _check_rows(gate_up, "gate_up")
    rows, width = gate_up.shape
    out = torch.empty(rows, width // 2, dtype=gate_up.dtype)
    launch(module, "silu_mul", silu_mul_params(gate_up, out), rows, threading)
    return out


def silu_mul_params(gate_up: torch.Tensor, out: torch.Tensor) -> array.array:
    """The checked parameters of silu_mul writing into `out` ([rows, inter], contiguous)."""
    _check_rows(gate_up, "gate_up")
    rows, width = gate_up.shape
    _require(width % 16 == 0, "gate_up's halves must be multiples of 8")
    _require(out.shape == (rows, width // 2) and out.dtype == gate_up.dtype and out.is_contiguous(),
             "bad output tensor")
    return kernel_params(out.data_ptr(), gate_up.data_ptr(), rows, width // 2, DTYPE_CODES[gate_up.dtype])


def check_positions(positions: torch.Tensor, max_positions: int) -> None:
    """Once per step: every position must index the rotary tables."""
    _require(positions.dtype == torch.int64 and positions.dim() == 1 and positions.is_contiguous(),
             "positions must be a contiguous int64 vector")
    if positions.numel():
        _require(0 <= int(positions.min()) and int(positions.max()) < max_positions,
                 f"a position lies outside the rotary tables ({max_positions})")


def rope_write_kv(module: ModuleType, qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                  sin_signed: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: StepPlan,
                  num_heads: int, q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float,
                  threading: str = "caller") -> torch.Tensor:
    """qkv: [tokens, (num_heads + 2 * kv_heads) * head_dim], the fused projection's output.
    Applies the per-head q/k norms (when given), NeoX rotary at `positions` (checked by check_positions)
    to q and k, writes K and V into the cache slots of `plan`, and returns q: [tokens, num_heads, head_dim].
    cos, sin_signed: [max_positions, head_dim] float32 (sin with its first half negated)."""
    _require(threading in THREADINGS, f"threading must be one of {THREADINGS}")
    _check_rows(qkv, "qkv")
    head_dim = _check_cache(k_cache, v_cache)
    q = torch.empty(qkv.shape[0], num_heads, head_dim, dtype=qkv.dtype)
    scratch = rope_scratch(qkv.shape[0], head_dim)
    params = rope_write_kv_params(qkv, positions, cos, sin_signed, k_cache, v_cache, plan, num_heads, q_norm,
                                  k_norm, eps, q, scratch)
    launch(module, "rope_write_kv", params, qkv.shape[0], threading)
    return q


def rope_write_kv_params(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor,
                         k_cache: torch.Tensor, v_cache: torch.Tensor, plan: StepPlan, num_heads: int,
                         q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float, q: torch.Tensor,
                         scratch: torch.Tensor) -> array.array:
    """The checked parameters of rope_write_kv writing q into `q` ([tokens, num_heads, head_dim],
    contiguous), with `scratch` from rope_scratch."""
    head_dim = _check_cache(k_cache, v_cache)
    kv_heads = k_cache.shape[2]
    _check_rows(qkv, "qkv")
    tokens = qkv.shape[0]
    _check_activation_dtype(qkv.dtype, k_cache, "qkv")
    _require(qkv.shape[1] == (num_heads + 2 * kv_heads) * head_dim, "qkv width does not match the heads")
    _require(head_dim % 16 == 0, "rotary halves must be multiples of 8")
    _require(tokens == plan.num_tokens and positions.shape == (tokens,), "one position and slot per token")
    check_slots(plan, k_cache)
    for table in (cos, sin_signed):
        _require(table.dtype == torch.float32 and table.is_contiguous() and table.dim() == 2
                 and table.shape[1] == head_dim, "rotary tables must be contiguous float32 [positions, head_dim]")
    _require((q_norm is None) == (k_norm is None), "q and k norms come together")
    if q_norm is not None:
        for w in (q_norm, k_norm):
            _require(w.shape == (head_dim,) and w.dtype == qkv.dtype and w.is_contiguous(), "bad q/k norm weight")
    _require(q.shape == (tokens, num_heads, head_dim) and q.dtype == qkv.dtype and q.is_contiguous(),
             "bad q output tensor")
    _require(scratch.dtype == torch.float32 and scratch.shape == (tokens, 2 * head_dim) and scratch.is_contiguous(),
             f"scratch must be contiguous float32 [{tokens}, {2 * head_dim}]")
    return kernel_params(q.data_ptr(), qkv.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                         plan.slot_mapping.data_ptr(), positions.data_ptr(), cos.data_ptr(), sin_signed.data_ptr(),
                         0 if q_norm is None else q_norm.data_ptr(), 0 if k_norm is None else k_norm.data_ptr(),
                         tokens, num_heads, kv_heads, head_dim, qkv.shape[1], float_bits(eps), scratch.data_ptr(),
                         DTYPE_CODES[qkv.dtype], kv_int8.cache_kind(k_cache), k_cache.shape[1])


def rope_scratch(tokens: int, head_dim: int) -> torch.Tensor:
    """rope_write_kv's float32 scratch: per token, a head's normed input and (for an int8 cache) its
    rotated K row before quantization."""
    return torch.empty(tokens, 2 * head_dim, dtype=torch.float32)

"""The int8 KV cache: its row layout and its quantization rule, in torch (the rule kernels/kv_int8.mojo
implements bit for bit).

A cache row (one token, one KV head) holds its head_dim values as int8, then their float32 scale in the
row's last 4 bytes, so a layer's K or V cache is [num_blocks, block_size, kv_heads, head_dim + 4] int8 and
everything that moves whole blocks (the block manager, prefix sharing, the plans) works unchanged.

Symmetric, one scale per (token, KV head): amax = max|x|, q = round-half-even(x * (127 / amax)),
scale = amax / 127 (a zero row stores q = 0, scale 0). x is the row in the activation dtype, i.e. what a
bfloat16 cache would hold, widened to float32. A row's bytes depend on that row's values alone, not on
which step, chunk or batch wrote it: the same prompt quantizes the same way whether it arrived in one
prefill, in chunks beside other requests, or token by token, which keeps greedy output batch-invariant.
(Per-block scales would have to be fixed before the block's later tokens exist, or rewritten as they
arrive, and then depend on how the block's tokens were split over steps.)

Reading dequantizes a row to float32 (q * scale); attention over it runs in float32.
"""

from __future__ import annotations

import torch

SCALE_BYTES = 4  # the float32 scale after each row's values
QMAX = 127


def is_int8(cache: torch.Tensor) -> bool:
    return cache.dtype == torch.int8


def row_width(head_dim: int, dtype: torch.dtype) -> int:
    """Elements per cache row of one token and one KV head."""
    return head_dim + SCALE_BYTES if dtype == torch.int8 else head_dim


def head_dim_of(cache: torch.Tensor) -> int:
    """The head_dim a cache of shape [..., row width] holds."""
    return cache.shape[-1] - SCALE_BYTES if is_int8(cache) else cache.shape[-1]


def quantize(x: torch.Tensor) -> torch.Tensor:
    """[..., head_dim] float rows -> [..., head_dim + 4] int8 cache rows (values, then float32 scale)."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)  # [..., 1]
    # A true division (a python number over a tensor goes through the reciprocal, another rounding).
    inv = torch.where(amax > 0, torch.full_like(amax, QMAX) / amax, torch.zeros_like(amax))
    q = torch.round(x * inv).clamp_(-QMAX, QMAX).to(torch.int8)  # torch.round is half-to-even
    scale = (amax / QMAX).contiguous().view(torch.int8)  # [..., 4]: the float32's bytes
    return torch.cat([q, scale], dim=-1)


def dequantize(rows: torch.Tensor) -> torch.Tensor:
    """[..., head_dim + 4] int8 cache rows -> [..., head_dim] float32."""
    head_dim = rows.shape[-1] - SCALE_BYTES
    return rows[..., :head_dim].float() * scales(rows)


def scales(rows: torch.Tensor) -> torch.Tensor:
    """[..., head_dim + 4] int8 cache rows -> [..., 1] float32 scales."""
    head_dim = rows.shape[-1] - SCALE_BYTES
    return rows[..., head_dim:].contiguous().view(torch.float32)

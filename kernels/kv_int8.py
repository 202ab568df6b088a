"""The int8 KV cache: its layout and its quantization rule, in torch (the rule kernels/kv_int8.mojo implements
bit for bit, and the layout the Mojo kernels read and write).

A layer's K or V cache is [num_blocks, block_size, kv_heads, head_dim + 4] int8: the same bytes per block as
rows of values and a float32 scale, so everything that moves whole blocks (the block manager, prefix sharing,
the plans) works unchanged. Inside a block the values come first, then the scales:
  values of (token t, KV head h): bytes (t * kv_heads + h) * head_dim of the block, head_dim of them;
  its float32 scale:              bytes block_size * kv_heads * head_dim + (t * kv_heads + h) * 4.
So every row of values starts on a multiple of head_dim bytes (64-byte cache lines hold whole rows at
head_dim 64 and 128), the scales of a block's rows lie together, and reading a key is the same loads as in a
bfloat16 cache, half as many bytes.

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

SCALE_BYTES = 4  # a row's float32 scale
QMAX = 127
FLOAT16_MAX = 65504.0  # a float16 cache's rows are clamped to its finite range as they are written

# The code the Mojo kernels read for a cache's dtype (kernels/kv_int8.mojo's constants of the same names): rows in
# the activations' dtype, int8 rows and scales, float16 rows beside float32 activations.
CACHE_SAME, CACHE_INT8, CACHE_F16 = 0, 1, 2
_CACHE_KINDS = {torch.int8: CACHE_INT8, torch.float16: CACHE_F16}


def cache_kind(cache: torch.Tensor) -> int:
    """The cache's kind code, CACHE_SAME unless it is int8 or float16."""
    return _CACHE_KINDS.get(cache.dtype, CACHE_SAME)


def to_float_cache(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows as a float cache of dtype holds them: float16 clamped to its finite range, then rounded to nearest-even
    (kernels/numerics.mojo narrow); other dtypes rounded."""
    if dtype == torch.float16:
        x = x.float().clamp(-FLOAT16_MAX, FLOAT16_MAX)
    return x.to(dtype)


def is_int8(cache: torch.Tensor) -> bool:
    return cache.dtype == torch.int8


def row_width(head_dim: int, dtype: torch.dtype) -> int:
    """The cache tensor's last dimension: elements per (token, KV head) in the block's bytes."""
    return head_dim + SCALE_BYTES if dtype == torch.int8 else head_dim


def head_dim_of(cache: torch.Tensor) -> int:
    """The head_dim a cache of shape [..., row width] holds."""
    return cache.shape[-1] - SCALE_BYTES if is_int8(cache) else cache.shape[-1]


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., head_dim] float rows -> their int8 values [..., head_dim] and float32 scales [...]."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)  # [..., 1]
    # A true division (a python number over a tensor goes through the reciprocal, another rounding).
    inv = torch.where(amax > 0, torch.full_like(amax, QMAX) / amax, torch.zeros_like(amax))
    q = torch.round(x * inv).clamp_(-QMAX, QMAX).to(torch.int8)  # torch.round is half-to-even
    return q, (amax / QMAX)[..., 0]


def split(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An int8 cache [num_blocks, block_size, kv_heads, head_dim + 4] -> views of its values [num_blocks,
    block_size, kv_heads, head_dim] int8 and its scales [num_blocks, block_size, kv_heads] float32."""
    num_blocks, block_size, kv_heads, row = cache.shape
    head_dim = row - SCALE_BYTES
    flat = cache.view(num_blocks, block_size * kv_heads * row)
    values_bytes = block_size * kv_heads * head_dim
    values = flat[:, :values_bytes].view(num_blocks, block_size, kv_heads, head_dim)
    scales = flat[:, values_bytes:].view(torch.float32).view(num_blocks, block_size, kv_heads)
    return values, scales


def to_cache(x: torch.Tensor) -> torch.Tensor:
    """A float cache [num_blocks, block_size, kv_heads, head_dim] -> the int8 cache holding its quantized rows."""
    num_blocks, block_size, kv_heads, head_dim = x.shape
    cache = torch.empty(num_blocks, block_size, kv_heads, head_dim + SCALE_BYTES, dtype=torch.int8)
    values, scales = split(cache)
    values[:], scales[:] = quantize_rows(x)
    return cache


def write(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """Quantizes x [num_tokens, kv_heads, head_dim] into the cache slots [num_tokens] (block * block_size +
    offset)."""
    values, scales = split(cache)
    block_size = cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    q, scale = quantize_rows(x)
    values[blocks, offsets] = q
    scales[blocks, offsets] = scale


def dequantize(cache: torch.Tensor) -> torch.Tensor:
    """An int8 cache (or an index_select of its blocks: [..., block_size, kv_heads, head_dim + 4]) -> float32
    [..., block_size, kv_heads, head_dim]."""
    lead = cache.shape[:-3]
    values, scales = split(cache.reshape(-1, *cache.shape[-3:]))
    return (values.float() * scales.unsqueeze(-1)).view(*lead, *values.shape[1:])

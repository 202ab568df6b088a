"""Building blocks shared by the Qwen3, Qwen2 and Llama decoders.

Numerics follow transformers' implementations step by step (RMSNorm in float32 then cast, rotary
tables cast to the activation dtype) so that bfloat16 runs agree with the reference as closely as
float32 runs do.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from worker.model_config import RopeScaling


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, **factory):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, **factory))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies, llama3-scaled when asked."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    # llama3: keep high frequencies, divide low ones by `factor`, interpolate smoothly between.
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """NeoX-style rotary embedding (rotate_half), the layout HF checkpoints of these models use."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: RopeScaling | None,
                 device: torch.device | str = "cpu"):
        super().__init__()
        inv_freq = rope_inverse_frequencies(head_dim, theta, scaling)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_positions, head_dim]
        # Plain attributes, not buffers: the weight loader materializes parameters with to_empty(),
        # which must not wipe these computed tables.
        self.cos = emb.cos().to(device)
        self.sin = emb.sin().to(device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [num_tokens]; q: [num_tokens, heads, head_dim]; k: [num_tokens, kv_heads, head_dim]."""
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)  # [num_tokens, 1, head_dim]
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

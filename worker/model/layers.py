"""Building blocks shared by the Qwen3, Qwen2 and Llama decoders.

Numerics follow transformers' implementations step by step (RMSNorm in float32 then cast, rotary
tables cast to the activation dtype) so that bfloat16 runs agree with the reference as closely as
float32 runs do.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from worker.checkpoint.model_config import RopeScaling


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, **factory):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, **factory))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # float32 normalization, then the weight in the activation dtype: transformers' order.
    return weight * F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype)


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


class RotaryEmbedding:
    """NeoX-style rotary embedding (rotate_half), the layout HF checkpoints of these models use."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: RopeScaling | None,
                 device: torch.device | str = "cpu"):
        inv_freq = rope_inverse_frequencies(head_dim, theta, scaling)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_positions, head_dim]
        half = head_dim // 2
        self.cos = emb.cos().to(device)
        # rotate_half(x) * sin == roll(x, half) * sin_signed with the first half of sin negated: one roll
        # instead of two slices, a negation and a cat per call, and bit-identical results.
        sin = emb.sin()
        self.sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).to(device)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [num_tokens] -> (cos, sin_signed), each [num_tokens, 1, head_dim] in dtype (transformers
        casts the tables to the activation dtype too). Computed once per step, used by every layer."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin_signed[positions].unsqueeze(1).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, heads, head_dim]."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * sin_signed

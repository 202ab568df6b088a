"""Rotary position embeddings: the frequency tables, scaled as the checkpoint says, and their application.

Every rule follows transformers' computation operation by operation (float32 frequencies, cos and sin times
the scaling's attention factor, tables cast to the activation dtype), so the tables are the reference's bits.
"""

from __future__ import annotations

import math

import torch

from worker.checkpoint.rope_scaling import Llama3Rope, LinearRope, RopeScaling, YarnRope


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies, scaled as asked."""
    if isinstance(scaling, YarnRope):
        return _yarn_frequencies(head_dim, theta, scaling)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if isinstance(scaling, LinearRope):
        return inv_freq / scaling.factor
    if isinstance(scaling, Llama3Rope):
        return _llama3_frequencies(inv_freq, scaling)
    return inv_freq


def _llama3_frequencies(inv_freq: torch.Tensor, scaling: Llama3Rope) -> torch.Tensor:
    # Keep high frequencies, divide low ones by `factor`, interpolate smoothly between.
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_frequencies(head_dim: int, theta: float, scaling: YarnRope) -> torch.Tensor:
    pos_freqs = theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (scaling.factor * pos_freqs)
    low, high = _yarn_correction_range(head_dim, theta, scaling)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: the dimension keeps its frequency; 0: interpolated
    return interpolated * (1 - keep) + extrapolated * keep


def _yarn_correction_range(head_dim: int, theta: float, scaling: YarnRope) -> tuple[float, float]:
    """The dimensions that turn beta_fast and beta_slow times over the original context."""
    def dimension(rotations: float) -> float:
        return (head_dim * math.log(scaling.original_max_position_embeddings / (rotations * 2 * math.pi))) / (
            2 * math.log(theta))
    low, high = dimension(scaling.beta_fast), dimension(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, head_dim - 1)


def attention_factor(scaling: RopeScaling | None) -> float:
    """What cos and sin are multiplied by: YaRN's temperature, 1 otherwise."""
    return scaling.attention_factor if isinstance(scaling, YarnRope) else 1.0


class RotaryEmbedding:
    """NeoX-style rotary embedding (rotate_half), the layout HF checkpoints of these models use."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: RopeScaling | None,
                 device: torch.device | str = "cpu"):
        inv_freq = rope_inverse_frequencies(head_dim, theta, scaling)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_positions, head_dim]
        half = head_dim // 2
        factor = attention_factor(scaling)
        self.cos = (emb.cos() * factor).to(device)
        # rotate_half(x) * sin == roll(x, half) * sin_signed with the first half of sin negated: one roll
        # instead of two slices, a negation and a cat per call, and bit-identical results.
        sin = emb.sin() * factor
        self.sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).to(device)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [num_tokens] -> (cos, sin_signed), each [num_tokens, 1, head_dim] in dtype (transformers
        casts the tables to the activation dtype too). Computed once per step, used by every layer."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin_signed[positions].unsqueeze(1).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, heads, head_dim]."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * sin_signed

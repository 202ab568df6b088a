"""Building blocks shared by the Qwen3, Qwen2 and Llama decoders (rotary embeddings: worker/model/rotary.py).

Numerics follow transformers' implementations step by step (RMSNorm in float32, then cast) so that bfloat16
runs agree with the reference as closely as float32 runs do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


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

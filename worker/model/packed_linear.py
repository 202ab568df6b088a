"""Linear layers with their weights reordered once into oneDNN's blocked layout (bfloat16 on the CPU).

`F.linear` on a plain row-major bfloat16 weight makes oneDNN re-block the weight on every call; for
a decode step, which reads every weight once, that doubles the memory traffic. Reordering once at
load time (what torch.compile's freezing does) measured 1.6x faster over all of the default model's
layers at 1 to 32 tokens and 1.5x at 256, with bit-identical results (loadtest/bench_engine.py).
"""

from __future__ import annotations

import torch
from torch import nn


def packing_supported(dtype: torch.dtype, device: torch.device | str) -> bool:
    return (torch.device(device).type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """y = x @ W.T + b with W in oneDNN's layout. `batch_hint` is the row count the layout is tuned for."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, batch_hint: int):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight_packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)
        self.bias = None if bias is None else bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [rows, in_features] -> [rows, out_features]."""
        return torch.ops.mkldnn._linear_pointwise(x, self.weight_packed, self.bias, "none", [], "")


def pack_linears(module: nn.Module, batch_hint: int) -> int:
    """Replaces every nn.Linear below `module` by a PackedLinear; returns how many."""
    count = 0
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child.weight, child.bias, batch_hint))
            count += 1
        else:
            count += pack_linears(child, batch_hint)
    return count

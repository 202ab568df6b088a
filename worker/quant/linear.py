"""Modules that serve quantized weights: QuantLinear (the projections and the output head, through the
Mojo kernel kernels/quant_matmul.mojo) and BlockEmbedding (token embeddings read from GGUF blocks).

Both are created on the meta device by the loader, in place of nn.Linear / nn.Embedding, so the
model dtype's copy of their weights is never allocated.
"""

from __future__ import annotations

import functools
import logging
from types import ModuleType

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize
from torch import nn

from worker.quant.blocks import KERNEL_KINDS, NAMES

log = logging.getLogger(__name__)

REQUIRED_CPU_FLAGS = ("avx512bw", "avx512_vnni")  # the kernel's 512-bit byte ops and vpdpbusd


@functools.cache
def kernel_module() -> ModuleType | None:
    """The quantized matmul's module, or None (with the reason logged) where it cannot run here."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    missing = [flag for flag in REQUIRED_CPU_FLAGS if flag not in flags]
    if missing:
        log.warning("quantized weights need CPU features %s, which this CPU lacks", ", ".join(missing))
        return None
    from kernels import mojo_quant
    from kernels.build import KernelBuildError

    try:
        module = mojo_quant.load()
    except (KernelBuildError, ImportError, OSError) as e:
        log.warning("quantized weight kernels unavailable: %s", e)
        return None
    log.info("quantized matmul: vpdpbusd%s", f", AMX int8 tiles from {mojo_quant.AMX_MIN_ROWS} rows"
             if mojo_quant.amx_available() else " (no AMX int8 tiles on this CPU)")
    return module


class QuantLinear(nn.Module):
    """y = x @ W.T (+ bias) with W kept as Q4_0, Q4_1 or Q8_0 blocks in the kernel's tile layout."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 device: torch.device | str = "meta", out_dtype: torch.dtype | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device), requires_grad=False) \
            if bias else None
        self.out_dtype = out_dtype  # None: the input's dtype
        self.qtype: QT | None = None
        self.packed: torch.Tensor | None = None  # [tiles, K / 32, record bytes] uint8
        self._bias_f32: torch.Tensor | None = None
        self._module: ModuleType | None = None

    def set_weight(self, packed: torch.Tensor, qtype: QT, module: ModuleType) -> None:
        self.packed, self.qtype, self._module = packed, qtype, module

    def finish_loading(self) -> None:
        """After the bias is loaded: the kernel adds it in float32."""
        self._bias_f32 = None if self.bias is None else self.bias.detach().float().contiguous()

    @property
    def type_name(self) -> str:
        return NAMES[self.qtype]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [rows, in_features] -> [rows, out_features]."""
        from kernels import mojo_quant

        return mojo_quant.qmatmul(self._module, x, self.packed, KERNEL_KINDS[self.qtype], self.out_features,
                                  bias=self._bias_f32, out_dtype=self.out_dtype or x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, type={self.qtype and self.type_name}"


class BlockEmbedding(nn.Module):
    """Token embeddings looked up in a GGUF's quantized rows (memory-mapped), dequantized per step:
    the rows a step needs, not the whole table."""

    def __init__(self, raw: np.ndarray, qtype: QT, dtype: torch.dtype, keep_alive: object):
        super().__init__()
        self.raw, self.qtype, self.dtype = raw, qtype, dtype  # raw: [vocab, row bytes] uint8
        self._keep_alive = keep_alive  # the open GGUF file the rows map

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: [tokens] int64 -> [tokens, hidden] in the model dtype."""
        rows = self.raw[ids.numpy()]
        return torch.from_numpy(dequantize(rows, self.qtype)).to(self.dtype)

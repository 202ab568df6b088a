"""Checked Python entry point to the matmul for the types of K-quant files (kernels/quant_kmatmul.mojo).

The kernel trusts its arguments, so everything it will follow is checked here first: dtypes, shapes,
contiguity and alignment of the activations, the packed weight tiles, the bias and the output. A bad
call raises ValueError and never reaches the kernel.
"""

from __future__ import annotations

import array
from types import ModuleType

import torch

from kernels.attention import DTYPE_CODES, THREADINGS, kernel_params
from kernels.quant_matmul import PATHS, amx_available, load_quant_module, use_amx
from kernels.quant_operands import (activation_addresses, activation_mode, activation_scratch_bytes,
                                    check_scratch, checked_output, run_quantized)

MODULE = "mili_quant_k"
# Kernel kind code (0 Q5_0, 1 Q5_1, 2 Q4_K, 3 Q6_K) -> (weights per K group, tile record bytes per group);
# kernels/formats/kblocks.py builds the records.
GROUPS = {0: (32, 352), 1: (32, 384), 2: (256, 64 + 8 * 288), 3: (256, 64 + 8 * 416)}


def load() -> ModuleType:
    return load_quant_module(MODULE)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"mojo K-quant matmul: {message}")


def qmatmul_k(module: ModuleType, x: torch.Tensor, packed: torch.Tensor, kind: int, n: int,
              bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
              out: torch.Tensor | None = None, threading: str = "omp", path: str = "auto",
              activations: str = "int8x2") -> torch.Tensor:
    """x: [M, K] float32 or bfloat16 -> x @ W.T (+ bias): [M, n] in out_dtype (x's dtype by default).
    packed: [ceil(n / 16), K / group, group bytes] uint8 tiles of W (worker/quant/kblocks.repack_k), kind
    its code. bias: [n] float32. `out`, when given, must be an [M, n] tensor of out_dtype with contiguous
    rows (a column slice of a wider row-major output is one).
    threading: "omp" quantizes the rows and then splits the column tiles over torch's OpenMP team.
    path: "vnni" (vpdpbusd), "amx" (AMX int8 tiles; ValueError where unavailable) or "auto" (AMX from
    kernels.quant_matmul.AMX_MIN_ROWS rows where available), as the main kernel's: the same bits for a row."""
    _require(threading in THREADINGS, f"threading must be one of {THREADINGS}")
    mode = activation_mode(_require, activations)
    out = _checked(x, packed, kind, n, bias, out_dtype, out, path)
    return run_quantized(module, ENTRIES, x, n, out, threading, lambda scratch, m: _params(
        x, packed, kind, n, bias, out, scratch, m, use_amx(m, path), mode))


# The kernel's C range entries (quantize the rows, then compute the column tiles) and the parameters a
# prebuilt call patches per step: the row count and the AMX switch (AMX_PARAM, the main kernel's slot).
ENTRIES = ("mili_quantk_rows_range", "mili_quantk_tiles_range")
ROWS_PARAM, AMX_PARAM = 4, 15


# Both quantized kernels share the activation scratch layout (kernels/quant_operands.py).
scratch_bytes = activation_scratch_bytes


def qmatmul_k_params(x: torch.Tensor, packed: torch.Tensor, kind: int, n: int, bias: torch.Tensor | None,
                     out: torch.Tensor, scratch: torch.Tensor, path: str = "auto",
                     activations: str = "int8x2") -> array.array:
    """The checked parameters of qmatmul_k over x's rows into `out`, for a caller that runs the kernel's
    ENTRIES itself and may lower the row count (ROWS_PARAM, with AMX_PARAM set by use_amx) to any
    m <= x's rows."""
    _checked(x, packed, kind, n, bias, out.dtype, out, path)
    m, k = x.shape
    check_scratch(_require, scratch, m, k)
    return _params(x, packed, kind, n, bias, out, scratch, m, use_amx(m, path), activation_mode(_require, activations))


def _checked(x: torch.Tensor, packed: torch.Tensor, kind: int, n: int, bias: torch.Tensor | None,
             out_dtype: torch.dtype | None, out: torch.Tensor | None, path: str) -> torch.Tensor:
    _require(path in PATHS, f"path must be one of {PATHS}")
    _require(path != "amx" or amx_available(), "AMX int8 tiles are not available on this CPU")
    _require(kind in GROUPS, f"unknown weight kind {kind}")
    group, group_bytes = GROUPS[kind]
    return checked_output(_require, x, packed, n, group, group_bytes, bias, out_dtype, out)


def _params(x: torch.Tensor, packed: torch.Tensor, kind: int, n: int, bias: torch.Tensor | None,
            out: torch.Tensor, scratch: torch.Tensor, m: int, amx: bool, mode: int) -> array.array:
    q1, q2, d, s, s_f, s_lo, stride = activation_addresses(scratch.data_ptr(), m, x.shape[1])
    return kernel_params(out.data_ptr(), x.data_ptr(), packed.data_ptr(), 0 if bias is None else bias.data_ptr(),
                         m, n, x.shape[1], kind, DTYPE_CODES[x.dtype], q1, d, s, s_f, DTYPE_CODES[out.dtype], q2,
                         int(amx), s_lo, out.stride(0), mode, stride)

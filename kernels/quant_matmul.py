"""Checked Python entry point to the quantized-weight matmul (kernels/quant_matmul.mojo).

The kernel trusts its arguments, so everything it will follow is checked here first: dtypes, shapes,
contiguity and alignment of the activations, the packed weight tiles, the bias and the output. A bad
call raises ValueError and never reaches the kernel.
"""

from __future__ import annotations

import array
import ctypes
import functools
import logging
from types import ModuleType

import torch

from kernels.attention import DTYPE_CODES, THREADINGS, kernel_params, load_module
from kernels.builder.modules import KernelBuildError
from kernels.builder.target import quant_kernels_unsupported
from kernels.quant_operands import (QK, activation_addresses, activation_mode, activation_scratch_bytes,
                                    check_scratch, checked_output, run_quantized)

MODULE = "mili_quant"
# Kernel kind code -> tile record bytes (see quant_matmul.mojo).
RECORD_BYTES = {0: 288, 1: 320, 2: 544}
PATHS = ("auto", "vnni", "amx")
# From this many rows on, "auto" computes the dot products on AMX tiles where the CPU has them
# (`make bench-quant` prints both paths by rows; the results are the same bits either way).
AMX_MIN_ROWS = 16  # AMX tiles take whole groups of 16 rows; the rest go through vpdpbusd

log = logging.getLogger(__name__)


@functools.cache
def amx_available() -> bool:
    """Whether this process may use AMX int8 tiles: the CPU has amx_tile and amx_int8, and Linux granted
    the tile data state (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once per process; a tile
    instruction without it kills the process)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    if not {"amx_tile", "amx_int8"} <= set(flags):
        return False
    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) != 0:
        log.warning("AMX tiles refused by the kernel (errno %d); the quantized matmul uses VNNI only",
                    ctypes.get_errno())
        return False
    return True


def load() -> ModuleType:
    return load_quant_module(MODULE)


def load_quant_module(name: str) -> ModuleType:
    """A quantized matmul's built module (this one's or quant_kmatmul's); KernelBuildError, before anything is
    built and never a SIGILL, on a CPU that cannot run it (kernels/builder/target.py's rule)."""
    reason = quant_kernels_unsupported()
    if reason is not None:
        raise KernelBuildError(reason)
    return load_module(name)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(f"mojo quantized matmul: {message}")


def qmatmul(module: ModuleType, x: torch.Tensor, packed: torch.Tensor, kind: int, n: int,
            bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
            out: torch.Tensor | None = None, threading: str = "omp", path: str = "auto",
            activations: str = "int8x2") -> torch.Tensor:
    """x: [M, K] float32 or bfloat16 -> x @ W.T (+ bias): [M, n] in out_dtype (x's dtype by default).
    packed: [ceil(n / 16), K / 32, record bytes] uint8 tiles of W (worker/quant/blocks.repack), kind its
    code (0 Q4_0, 1 Q4_1, 2 Q8_0). bias: [n] float32. `out`, when given, must be an [M, n] tensor of
    out_dtype with contiguous rows: a contiguous one, or a column slice of a wider row-major output
    (tests pass ones poisoned with NaN). threading: "omp" quantizes the rows and then
    splits the column tiles over torch's OpenMP team (one thread when the bridge is unavailable).
    path: "vnni" (vpdpbusd), "amx" (AMX int8 tiles; ValueError where unavailable) or "auto" (AMX from
    AMX_MIN_ROWS rows where available): every path gives the same bits for a row."""
    _require(threading in THREADINGS, f"threading must be one of {THREADINGS}")
    mode = activation_mode(_require, activations)
    out = _checked(x, packed, kind, n, bias, out_dtype, out, path)
    return run_quantized(module, ENTRIES, x, n, out, threading, lambda scratch, m: _params(
        x, packed, kind, n, bias, out, scratch, m, use_amx(m, path), mode))


# The kernel's C range entries (quantize the rows, then compute the column tiles) and the parameters a
# prebuilt call patches per step: the row count and the AMX switch.
ENTRIES = ("mili_quantize_rows_range", "mili_qmatmul_tiles_range")
ROWS_PARAM, AMX_PARAM = 4, 15


def use_amx(m: int, path: str = "auto") -> bool:
    """Whether a call of m rows computes on AMX tiles (the same bits as vpdpbusd either way)."""
    return path == "amx" or (path == "auto" and m >= AMX_MIN_ROWS and amx_available())


# Both quantized kernels share the activation scratch layout (kernels/quant_operands.py).
scratch_bytes = activation_scratch_bytes


def qmatmul_params(x: torch.Tensor, packed: torch.Tensor, kind: int, n: int, bias: torch.Tensor | None,
                   out: torch.Tensor, scratch: torch.Tensor, path: str = "auto",
                   activations: str = "int8x2") -> array.array:
    """The checked parameters of qmatmul over x's rows into `out`, for a caller that runs the kernel's
    ENTRIES itself (worker/runner/decode_program.py) and may lower the row count (ROWS_PARAM, with AMX_PARAM
    set by use_amx) to any m <= x's rows: the scratch layout is fixed by x's rows, and a row's result
    does not depend on it."""
    _checked(x, packed, kind, n, bias, out.dtype, out, path)
    m, k = x.shape
    check_scratch(_require, scratch, m, k)
    return _params(x, packed, kind, n, bias, out, scratch, m, use_amx(m, path), activation_mode(_require, activations))


def _checked(x: torch.Tensor, packed: torch.Tensor, kind: int, n: int, bias: torch.Tensor | None,
             out_dtype: torch.dtype | None, out: torch.Tensor | None, path: str) -> torch.Tensor:
    _require(path in PATHS, f"path must be one of {PATHS}")
    _require(path != "amx" or amx_available(), "AMX int8 tiles are not available on this CPU")
    _require(kind in RECORD_BYTES, f"unknown weight kind {kind}")
    return checked_output(_require, x, packed, n, QK, RECORD_BYTES[kind], bias, out_dtype, out)


def _params(x: torch.Tensor, packed: torch.Tensor, kind: int, n: int, bias: torch.Tensor | None,
            out: torch.Tensor, scratch: torch.Tensor, m: int, amx: bool, mode: int) -> array.array:
    q1, q2, d, s, s_f, s_lo, stride = activation_addresses(scratch.data_ptr(), m, x.shape[1])
    return kernel_params(out.data_ptr(), x.data_ptr(), packed.data_ptr(), 0 if bias is None else bias.data_ptr(),
                         m, n, x.shape[1], kind, DTYPE_CODES[x.dtype], q1, d, s, s_f, DTYPE_CODES[out.dtype], q2,
                         int(amx), s_lo, out.stride(0), mode, stride)

"""What both quantized matmuls (kernels/quant_matmul.py, kernels/quant_kmatmul.py) share on the Python side:
the operand checks they make before their kernels, which trust every pointer and shape they are given,
and the scratch their shared activation quantizer (kernels/quant_activations.mojo) writes."""

from __future__ import annotations

import array
from collections.abc import Callable, Sequence
from types import ModuleType

import torch

from kernels.attention import DTYPE_CODES, omp_team

QK = 32  # activations per quantization block
TILE = 16  # output columns per packed weight tile
WEIGHT_ALIGNMENT = 64  # tile records are streamed with 64-byte loads
# How the kernels quantize activations (kernels/quant_activations.mojo), chosen once per server
# (shared/config.py's --activation-quantization), never per call: a mode name -> its parameter value.
# int8x2: two int8 parts per activation (about 15 bits, two vpdpbusd per 4 K-steps); int8: one, as llama.cpp's
# Q8_0 activations (about 8 bits, one vpdpbusd per 4 K-steps: about twice the many-row throughput).
ACTIVATION_MODES = {"int8x2": 0, "int8": 1}
ACTIVATION_MODE_PARAM = 18  # P_ACT_MODE in kernels/quant_activations.mojo


def checked_output(require: Callable[[bool, str], None], x: torch.Tensor, packed: torch.Tensor, n: int,
                   group: int, group_bytes: int, bias: torch.Tensor | None, out_dtype: torch.dtype | None,
                   out: torch.Tensor | None) -> torch.Tensor:
    """Checks x [M, K], the packed tiles [ceil(n / 16), K / group, group_bytes] uint8, bias [n] float32 and
    `out` (made when None) through `require`; returns the [M, n] output tensor."""
    require(x.dim() == 2 and x.is_contiguous(), "x must be a contiguous [rows, K] tensor")
    require(x.dtype in DTYPE_CODES, f"x: unsupported dtype {x.dtype}")
    m, k = x.shape
    require(k > 0 and k % group == 0, f"K = {k} is not a positive multiple of {group}")
    require(n > 0, f"n = {n} must be positive")
    tiles = -(-n // TILE)
    require(packed.dtype == torch.uint8 and packed.is_contiguous()
            and tuple(packed.shape) == (tiles, k // group, group_bytes),
            f"packed weights must be contiguous uint8 [{tiles}, {k // group}, {group_bytes}], "
            f"got {packed.dtype} {list(packed.shape)}")
    require(packed.data_ptr() % WEIGHT_ALIGNMENT == 0, f"packed weights must be {WEIGHT_ALIGNMENT}-byte aligned")
    if bias is not None:
        require(bias.dtype == torch.float32 and bias.shape == (n,) and bias.is_contiguous(),
                f"bias must be a contiguous float32 [{n}]")
    out_dtype = out_dtype or x.dtype
    require(out_dtype in DTYPE_CODES, f"unsupported output dtype {out_dtype}")
    if out is None:
        out = torch.empty(m, n, dtype=out_dtype)
    require(out.dtype == out_dtype and tuple(out.shape) == (m, n), "bad output tensor")
    # Rows of n elements ldc apart: a contiguous output, or a column slice of a wider row-major one
    # (a fused projection's segments each write their own columns of one output).
    require(out.stride(1) == 1 and out.stride(0) >= n,
            f"bad output tensor: rows of {n} contiguous elements expected, got strides {list(out.stride())}")
    return out


def activation_mode(require: Callable[[bool, str], None], activations: str) -> int:
    """The kernels' parameter value of an activation mode name (ACTIVATION_MODES), checked through `require`."""
    require(activations in ACTIVATION_MODES, f"activations must be one of {tuple(ACTIVATION_MODES)}")
    return ACTIVATION_MODES[activations]


def block_stride(m: int) -> int:
    """Rows between consecutive blocks in the per-block activation arrays ([K / 32, stride], parameter slot
    BLOCK_STRIDE_PARAM): at least m, a multiple of 16 (the AMX path reads 16 rows' values at once), and an odd
    number of 16s, so that block b's values and block b + 1's are an odd number of 64-byte lines apart and never
    share a cache set. With the stride m itself, a 2048-row prefill put every block's values 8 KiB apart, in one
    L1 set, and the quantizer's stores and the kernels' loads of them missed L1 block after block (a one-tile
    2048 x 576 call took 1.75x as long as at 2040 rows; full shapes lost 0-5%)."""
    sixteens = -(-m // 16)
    return 16 * (sixteens | 1)


def activation_scratch_bytes(m: int, k: int) -> int:
    """Bytes of scratch for m rows of K activations quantized by kernels/quant_activations.mojo (the layout
    is in activation_addresses)."""
    return 2 * m * k + 16 * block_stride(m) * (k // QK) + 64


def check_scratch(require: Callable[[bool, str], None], scratch: torch.Tensor, m: int, k: int) -> None:
    """A caller-provided activation scratch must hold m rows of K (activation_scratch_bytes)."""
    need = activation_scratch_bytes(m, k)
    require(scratch.dtype == torch.uint8 and scratch.is_contiguous() and scratch.numel() >= need,
            f"scratch must be contiguous uint8 of at least {need} bytes")


def activation_addresses(base: int, m: int, k: int) -> tuple[int, int, int, int, int, int, int]:
    """The quantized activations' places in scratch at `base` (activation_scratch_bytes(m, k) long):
    int8 q1 and q2 [M, K] each, then [K / 32, block_stride(m)] float32 d, int32 sum q, float32 d * sum q and
    int32 sum over elements 0-15. Returns (q1, q2, d, sum, d * sum, sum lo, stride), in the order of the kernels'
    parameter slots P_Q1, P_Q2, P_D, P_SUM, P_SUM_F, P_SUM_LO, P_BLOCK_STRIDE. A caller may run fewer rows than
    m through this layout (the stride stays m's)."""
    nb, stride = k // QK, block_stride(m)
    q1, q2, d = base, base + m * k, base + 2 * m * k
    d += -d % 4
    return q1, q2, d, d + 4 * stride * nb, d + 8 * stride * nb, d + 12 * stride * nb, stride


# The parameter slots phase 1 (kernels/quant_activations.mojo) reads or writes, the same in both kernels'
# arrays: x, rows, K, x's dtype, then q1, d, sum, d * sum, q2, sum lo in the scratch, the mode and the per-block
# arrays' stride.
BLOCK_STRIDE_PARAM = 19  # P_BLOCK_STRIDE in kernels/quant_activations.mojo
ACTIVATION_PARAMS = (1, 4, 6, 8, 9, 10, 11, 12, 14, 16, ACTIVATION_MODE_PARAM, BLOCK_STRIDE_PARAM)
OUTPUT_STRIDE_PARAM = 17  # the output's row stride in elements (P_LDC in both kernels)


def same_activations(params: Sequence[int], other: Sequence[int]) -> bool:
    """Whether two calls' parameters (of either kernel) quantize the same x into the same scratch places,
    so one call's phase 1 serves the other's phase 2."""
    return all(params[i] == other[i] for i in ACTIVATION_PARAMS)


def run_quantized(module: ModuleType, entries: tuple[str, str], x: torch.Tensor, n: int, out: torch.Tensor,
                  threading: str, params_for: Callable[[torch.Tensor, int], array.array]) -> torch.Tensor:
    """A checked call's two phases into `out` ([M, n]), with the parameters params_for(scratch, m) gives: on
    torch's OpenMP team where threading is "omp" and the bridge is available (the rows quantized by the entry
    entries[0], then the column tiles split by entries[1]), otherwise both on the calling thread."""
    m, k = x.shape
    if m == 0:
        return out
    scratch = torch.empty(activation_scratch_bytes(m, k), dtype=torch.uint8)  # alive until the kernel returns
    params = params_for(scratch, m)
    team = omp_team() if threading == "omp" else None
    if team is not None:
        team.run2(module, entries[0], m, entries[1], -(-n // TILE), params)
    else:
        module.qmatmul((params.buffer_info()[0],))
    return out

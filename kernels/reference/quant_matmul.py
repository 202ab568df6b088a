"""NumPy references for the quantized-weight matmul (kernels/quant_matmul.mojo).

`qmatmul_blocks` does the kernel's own block arithmetic: the activations quantized per 32-element
block the same way (in either activation mode: two int8 parts, "int8x2", or one, "int8"; round half to even,
float32 scale), the integer dot products exact in int64, then the float32 epilogue block by block. It
differs from the kernel only by fused multiply-adds.
`dequantized_matmul` is the float64 product with gguf.quants' dequantization: the quantity both
approximate, off by the activations' rounding (to about 15 bits per 32-element block in int8x2, 8 in int8).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

from kernels.formats.blocks import QK, split_blocks

OFFSETS = {QT.Q4_0: 8, QT.Q4_1: 0, QT.Q8_0: 128}  # subtracted from the stored unsigned quants
# Per activation mode (kernels/quant_operands.py's ACTIVATION_MODES), the largest |q|: d = max|x| / STEPS[mode].
STEPS = {"int8x2": 127 * 254, "int8": 127}


def quantize_activations(x: np.ndarray, activations: str = "int8x2") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x: [M, K] float32 -> (q [M, K/32, 32] int64, d [M, K/32] float32, sum q [M, K/32] int64) with
    x ~= d * q per block, t = x * 127 / max|x| (float32). int8x2: q = round(254 t) and d = max|x| / 32258,
    which the kernel holds as two int8 parts, q1 = round(t) and q2 = q - 254 q1 (see split_activations).
    int8: q = round(t) (llama.cpp's Q8_0 activations) and d = max|x| / 127."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, QK)
    amax = np.abs(blocks).max(axis=-1)
    d = (amax / np.float32(STEPS[activations])).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    t = (blocks * inv[..., None]).astype(np.float32)
    if activations == "int8":
        q = np.rint(t).astype(np.int64)
    else:
        q = np.rint((t * np.float32(254)).astype(np.float32)).astype(np.int64)  # = 254 q1 + q2
    return q, d, q.sum(axis=-1)


def split_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's two int8 parts of quantize_activations' q: (q1, q2) [M, K/32, 32] with q = 254 q1 + q2."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, QK)
    amax = np.abs(blocks).max(axis=-1)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q1 = np.rint((blocks * inv[..., None]).astype(np.float32)).astype(np.int64)
    q, _, _ = quantize_activations(x)
    return q1, q - 254 * q1


def qmatmul_blocks(x: np.ndarray, raw: np.ndarray, qtype: QT, bias: np.ndarray | None = None,
                   activations: str = "int8x2") -> np.ndarray:
    """x: [M, K] float32, raw: GGUF rows [N, K/32 * block bytes] -> [M, N] float32."""
    qa, da, sa = quantize_activations(x, activations)
    qw, dw, mw = split_blocks(raw, qtype)
    dot = np.einsum("mbk,nbk->mnb", qa, qw.astype(np.int64))  # exact
    corrected = dot - OFFSETS[qtype] * sa[:, None, :]
    y = np.zeros((x.shape[0], raw.shape[0]), np.float32)
    dwf = dw.astype(np.float32)
    for b in range(qa.shape[1]):  # block by block, as the kernel accumulates
        y = y + corrected[:, :, b].astype(np.float32) * (dwf[None, :, b] * da[:, None, b])
        if mw is not None:
            y = y + mw.astype(np.float32)[None, :, b] * (da[:, None, b] * sa[:, None, b].astype(np.float32))
    if bias is not None:
        y = y + bias.astype(np.float32)
    return y


def dequantized_matmul(x: np.ndarray, raw: np.ndarray, qtype: QT) -> np.ndarray:
    """x @ dequantize(raw).T in float64."""
    return x.astype(np.float64) @ dequantize(raw, qtype).astype(np.float64).T


def activation_error_bound(x: np.ndarray, raw: np.ndarray, qtype: QT, activations: str = "int8x2") -> np.ndarray:
    """[M, N] bound on |qmatmul - dequantized_matmul| from the quantized activations: each activation moves
    by at most half a step (max|block| / (2 * 127 * 254) in int8x2, / (2 * 127) in int8), times |w| summed
    (plus float32 rounding slack)."""
    blocks = np.abs(x.astype(np.float64)).reshape(x.shape[0], -1, QK)
    step = blocks.max(axis=-1, keepdims=True) / (2.0 * STEPS[activations])
    half_steps = np.broadcast_to(step, blocks.shape).reshape(x.shape)
    w = np.abs(dequantize(raw, qtype).astype(np.float64))
    return half_steps @ w.T * 1.001 + 1e-5 * (np.abs(x.astype(np.float64)) @ w.T) + 1e-6

"""NumPy reference for the K-quant-file matmul (kernels/quant_kmatmul.mojo): the kernel's own block
arithmetic on the same activations (two int8 parts or one) as the main kernel's (kernels/reference/quant_matmul.py),
with the
integer dot products exact in int64 and the float32 epilogue block by block, so it differs from the
kernel only by fused multiply-adds. The float64 product with gguf.quants' dequantization and the
activations' error bound are kernels/reference/quant_matmul.py's (they hold for any GGUF type).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from kernels.formats.kblocks import split_kblocks
from kernels.reference.quant_matmul import quantize_activations


def qkmatmul_blocks(x: np.ndarray, raw: np.ndarray, qtype: QT, bias: np.ndarray | None = None,
                    activations: str = "int8x2") -> np.ndarray:
    """x: [M, K] float32, raw: GGUF rows [N, ...] of Q5_0, Q5_1, Q4_K or Q6_K -> [M, N] float32, with the
    activations quantized in the given mode (int8x2 or int8)."""
    # [M, nb, 32] int64 (int8x2: 254 q1 + q2; int8: q1), [M, nb] float32, [M, nb] int64
    qa, da, sa = quantize_activations(x, activations)
    kb = split_kblocks(raw, qtype)
    qw = kb.q.astype(np.int64)  # [N, nb, 32]
    lo = np.einsum("mbk,nbk->mnb", qa[..., :16], qw[..., :16])  # exact
    hi = np.einsum("mbk,nbk->mnb", qa[..., 16:], qw[..., 16:])
    s_lo, s_hi = qa[..., :16].sum(axis=-1), qa[..., 16:].sum(axis=-1)  # [M, nb]
    s_f = (da * sa.astype(np.float32)).astype(np.float32)
    y = np.zeros((x.shape[0], raw.shape[0]), np.float32)
    f32 = np.float32
    for b in range(qa.shape[1]):  # block by block, as the kernel accumulates
        sb = b // 8
        if qtype == QT.Q6_K:  # each half's product is an exact int32; they meet in float32
            acc = (kb.sc[None, :, 2 * b].astype(np.int64) * (lo[:, :, b] - 32 * s_lo[:, None, b])).astype(f32) \
                + (kb.sc[None, :, 2 * b + 1].astype(np.int64) * (hi[:, :, b] - 32 * s_hi[:, None, b])).astype(f32)
            dw = kb.d[:, sb].astype(f32)
        elif qtype == QT.Q5_0:
            acc = lo[:, :, b] + hi[:, :, b] - 16 * (s_lo[:, None, b] + s_hi[:, None, b])
            dw = kb.d[:, b].astype(f32)
        elif qtype == QT.Q5_1:
            acc, dw, mw = lo[:, :, b] + hi[:, :, b], kb.d[:, b].astype(f32), kb.m[:, b].astype(f32)
        else:  # Q4_K: d * sc and dmin * mn are exact in float32
            acc = lo[:, :, b] + hi[:, :, b]
            dw = kb.d[:, sb].astype(f32) * kb.sc[:, b].astype(f32)
            mw = -(kb.dmin[:, sb].astype(f32) * kb.mn[:, b].astype(f32))
        y = y + acc.astype(f32) * (dw[None, :] * da[:, None, b])
        if qtype in (QT.Q5_1, QT.Q4_K):
            y = y + mw[None, :] * s_f[:, None, b]
    if bias is not None:
        y = y + bias.astype(np.float32)
    return y

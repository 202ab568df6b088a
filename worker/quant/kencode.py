"""Writing the types of K-quant files: round-to-nearest encoders from float weights (Q4_K and Q6_K, which
gguf.quants cannot write; Q5_0 / Q5_1 through gguf.quants), and random valid blocks. The tests build
GGUFs with them, and so does the benchmark's model generator (loadtest/fixtures/make_gguf.py); serving never
needs them.

The encoders are plain round-to-nearest (llama.cpp's own Q4_K/Q6_K quantizers also search the scales);
what they write is valid GGUF data that llama.cpp and gguf.quants decode the same way.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

from kernels.formats.kblocks import QK, QK_K, KBlocks, pack_kblocks


def _f16_scale(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def quantize_k(w: np.ndarray, qtype: QT) -> np.ndarray:
    """w: [N, K] float -> GGUF rows of qtype (K a multiple of 256 for Q4_K/Q6_K, of 32 for Q5_x)."""
    w = np.asarray(w, dtype=np.float32)
    if qtype in (QT.Q5_0, QT.Q5_1):
        return quantize(w, qtype)
    n, k = w.shape
    if k % QK_K:
        raise ValueError(f"{qtype.name} needs K divisible by {QK_K}, got {k}")
    nsb = k // QK_K
    with np.errstate(divide="ignore", invalid="ignore"):
        if qtype == QT.Q4_K:
            x = w.reshape(n, nsb, 8, QK)
            offset = np.maximum(0.0, -x.min(axis=-1))  # w = d*sc*q - dmin*mn with mn >= 0
            scale = (x.max(axis=-1) + offset) / 15
            d = _f16_scale(scale.max(axis=-1) / 63)
            dmin = _f16_scale(offset.max(axis=-1) / 63)
            sc = np.nan_to_num(np.rint(scale / d.astype(np.float32)[..., None])).clip(0, 63).astype(np.uint8)
            mn = np.nan_to_num(np.rint(offset / dmin.astype(np.float32)[..., None])).clip(0, 63).astype(np.uint8)
            eff_d = d.astype(np.float32)[..., None] * sc
            eff_m = dmin.astype(np.float32)[..., None] * mn
            q = np.where(eff_d[..., None] > 0, np.rint((x + eff_m[..., None]) / eff_d[..., None]), 0)
            kb = KBlocks(q=q.clip(0, 15).astype(np.uint8).reshape(n, nsb * 8, QK), d=d, dmin=dmin,
                         sc=sc.reshape(n, -1), mn=mn.reshape(n, -1))
            return pack_kblocks(kb, qtype)
        if qtype == QT.Q6_K:
            x = w.reshape(n, nsb, 16, 16)
            scale = np.abs(x).max(axis=-1) / 31
            d = _f16_scale(scale.max(axis=-1) / 127)
            sc = np.nan_to_num(np.rint(scale / d.astype(np.float32)[..., None])).clip(-128, 127).astype(np.int8)
            eff = d.astype(np.float32)[..., None] * sc
            q = np.where(eff[..., None] > 0, np.rint(x / eff[..., None]), 0).clip(-32, 31) + 32
            kb = KBlocks(q=q.astype(np.uint8).reshape(n, nsb * 8, QK), d=d, sc=sc.reshape(n, -1))
            return pack_kblocks(kb, qtype)
    raise ValueError(f"no encoder for {qtype.name}")


def random_kblocks(rng: np.random.Generator, rows: int, k: int, qtype: QT, scale: float = 0.02) -> np.ndarray:
    """[rows, ...] GGUF rows of qtype with uniformly random quants and scales, weights of standard
    deviation about `scale` (scales drawn within a factor of 3 of the value that gives it)."""
    nb = k // QK

    def jitter(shape: tuple[int, ...]) -> np.ndarray:
        return rng.uniform(0.5, 1.5, shape)

    if qtype in (QT.Q5_0, QT.Q5_1):  # q uniform in 0..31: standard deviation 9.2
        q = rng.integers(0, 32, (rows, nb, QK), dtype=np.uint8)
        d = (jitter((rows, nb)) * scale / 9.2).astype(np.float16)
        m = (-15.5 * d.astype(np.float32) * jitter((rows, nb))).astype(np.float16) if qtype == QT.Q5_1 else None
        return pack_kblocks(KBlocks(q=q, d=d, m=m), qtype)
    nsb = k // QK_K
    if qtype == QT.Q4_K:  # d*sc*q - dmin*mn, q in 0..15, sc and mn in 0..63: about 256 d
        d = (jitter((rows, nsb)) * scale / 256).astype(np.float16)
        kb = KBlocks(q=rng.integers(0, 16, (rows, nb, QK), dtype=np.uint8), d=d,
                     dmin=(7.5 * d.astype(np.float32) * jitter((rows, nsb))).astype(np.float16),
                     sc=rng.integers(0, 64, (rows, nb), dtype=np.uint8),
                     mn=rng.integers(0, 64, (rows, nb), dtype=np.uint8))
        return pack_kblocks(kb, qtype)
    if qtype == QT.Q6_K:  # d*sc*(q-32), sc in -128..127, q in 0..63: about 1370 d
        kb = KBlocks(q=rng.integers(0, 64, (rows, nb, QK), dtype=np.uint8),
                     d=(jitter((rows, nsb)) * scale / 1370).astype(np.float16),
                     sc=rng.integers(-128, 128, (rows, 2 * nb), dtype=np.int8))
        return pack_kblocks(kb, qtype)
    raise ValueError(f"no random blocks for {qtype.name}")

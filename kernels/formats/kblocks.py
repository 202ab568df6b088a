"""The GGUF types of K-quant files (Q5_0, Q5_1, Q4_K, Q6_K) as integers, and their repacking into the
tiles of kernels/quant_kmatmul.mojo.

GGUF layouts (llama.cpp's ggml-common.h; gguf.quants decodes the same):
  Q5_0 (32 weights, 22 B): f16 d | 4 B bit 4 of each weight | 16 B nibbles      w = d * (q - 16)
  Q5_1 (32 weights, 24 B): f16 d | f16 m | 4 B bit 4 | 16 B nibbles            w = d * q + m
  Q4_K (256 weights, 144 B): f16 d | f16 dmin | 12 B of 6-bit sc and mn per 32 | 128 B nibbles
                                                          w = d * sc * q - dmin * mn
  Q6_K (256 weights, 210 B): 128 B low nibbles | 64 B high 2 bits | 16 int8 sc per 16 | f16 d
                                                          w = d * sc * (q - 32)
`split_kblocks` decodes rows of those into unsigned quants and scales; `pack_kblocks` is its inverse
(tests and the GGUF generator build files with it); `repack_k` lays the quants out as the kernel streams
them (the record layout is described in kernels/quant_kmatmul.mojo).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT

QK = 32  # activation block; also Q5_x's block
QK_K = 256  # K-quant super-block
TILE = 16

# Types this kernel serves -> its kind code (kernels/quant_kmatmul.mojo).
KQUANT_KINDS = {QT.Q5_0: 0, QT.Q5_1: 1, QT.Q4_K: 2, QT.Q6_K: 3}
# Bytes of one tile record per 32-element block, and of the super-block header (K-quants).
BLOCK_RECORD_BYTES = {QT.Q5_0: 352, QT.Q5_1: 384, QT.Q4_K: 288, QT.Q6_K: 416}
HEADER_BYTES = {QT.Q5_0: 0, QT.Q5_1: 0, QT.Q4_K: 64, QT.Q6_K: 64}
BLOCKS_PER_GROUP = {QT.Q5_0: 1, QT.Q5_1: 1, QT.Q4_K: 8, QT.Q6_K: 8}
NAMES = {QT.Q5_0: "q5_0", QT.Q5_1: "q5_1", QT.Q4_K: "q4_k", QT.Q6_K: "q6_k"}


def group_bytes(qtype: QT) -> int:
    """Bytes of a tile's record for one group of K (a block for Q5_x, a super-block for K-quants)."""
    return HEADER_BYTES[qtype] + BLOCKS_PER_GROUP[qtype] * BLOCK_RECORD_BYTES[qtype]


def group_size(qtype: QT) -> int:
    return QK * BLOCKS_PER_GROUP[qtype]


@dataclass
class KBlocks:
    """Decoded rows. q: [rows, K/32, 32] uint8 unsigned quants (Q5: 0-31, Q4_K: 0-15, Q6_K: 0-63).
    d: [rows, K/32] (Q5_x) or [rows, K/256] (K-quants) float16; m: Q5_1's [rows, K/32] float16 mins;
    dmin: Q4_K's [rows, K/256] float16; sc, mn: Q4_K's [rows, K/32] uint8 6-bit scales and mins;
    Q6_K's sc is [rows, K/16] int8."""
    q: np.ndarray
    d: np.ndarray
    m: np.ndarray | None = None
    dmin: np.ndarray | None = None
    sc: np.ndarray | None = None
    mn: np.ndarray | None = None


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16)[..., 0]


def split_kblocks(raw: np.ndarray, qtype: QT) -> KBlocks:
    """raw: [rows, K / block * block bytes] uint8 GGUF rows -> KBlocks."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rows = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(rows, -1, type_size)
    nblk = blocks.shape[1]
    if qtype in (QT.Q5_0, QT.Q5_1):
        off = 2 if qtype == QT.Q5_0 else 4
        high = np.unpackbits(blocks[..., off:off + 4], axis=-1, bitorder="little")  # [rows, nb, 32]
        nib = blocks[..., off + 4:off + 20]
        q = np.concatenate([nib & 0x0F, nib >> 4], axis=-1) | (high << 4)
        m = _f16(blocks[..., 2:4]) if qtype == QT.Q5_1 else None
        return KBlocks(q=q, d=_f16(blocks[..., 0:2]), m=m)
    if qtype == QT.Q4_K:
        s = blocks[..., 4:16].reshape(rows, nblk, 3, 4)
        a, b, c = s[..., 0, :], s[..., 1, :], s[..., 2, :]
        sc = np.concatenate([a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30)], axis=-1)
        mn = np.concatenate([b & 0x3F, (c >> 4) | ((b >> 2) & 0x30)], axis=-1)
        qs = blocks[..., 16:].reshape(rows, nblk, 4, 1, 32)  # 4 chunks of 64 weights: low nibbles, then high
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=3).reshape(rows, nblk * 8, 32)
        return KBlocks(q=q, d=_f16(blocks[..., 0:2]), dmin=_f16(blocks[..., 2:4]),
                       sc=sc.reshape(rows, nblk * 8), mn=mn.reshape(rows, nblk * 8))
    if qtype == QT.Q6_K:
        ql = blocks[..., :128].reshape(rows, nblk, 2, 1, 64)  # per half of 128 weights
        low = np.concatenate([ql & 0x0F, ql >> 4], axis=3).reshape(rows, nblk, 2, 4, 32)
        qh = blocks[..., 128:192].reshape(rows, nblk, 2, 1, 32)
        high = (qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)) & 0x03
        q = (low | (high << 4)).reshape(rows, nblk * 8, 32)
        sc = blocks[..., 192:208].copy().view(np.int8).reshape(rows, nblk * 16)
        return KBlocks(q=q, d=_f16(blocks[..., 208:210]), sc=sc)
    raise ValueError(f"{qtype.name} is not a K-quant-file type")


def pack_kblocks(kb: KBlocks, qtype: QT) -> np.ndarray:
    """The inverse of split_kblocks: KBlocks -> [rows, K / block * block bytes] uint8 GGUF rows."""
    q = kb.q.astype(np.uint8)
    rows = q.shape[0]

    def f16_bytes(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.astype(np.float16)).view(np.uint8).reshape(*x.shape, 2)

    if qtype in (QT.Q5_0, QT.Q5_1):
        nib = (q[..., :16] & 0x0F) | ((q[..., 16:] & 0x0F) << 4)
        high = np.packbits((q >> 4) & 1, axis=-1, bitorder="little")
        parts = [f16_bytes(kb.d)] + ([f16_bytes(kb.m)] if qtype == QT.Q5_1 else []) + [high, nib]
        return np.concatenate(parts, axis=-1).reshape(rows, -1)
    nsb = q.shape[1] // 8
    if qtype == QT.Q4_K:
        sc = kb.sc.reshape(rows, nsb, 8).astype(np.uint8)
        mn = kb.mn.reshape(rows, nsb, 8).astype(np.uint8)
        a = (sc[..., :4] & 0x3F) | ((sc[..., 4:] & 0x30) << 2)
        b = (mn[..., :4] & 0x3F) | ((mn[..., 4:] & 0x30) << 2)
        c = (sc[..., 4:] & 0x0F) | ((mn[..., 4:] & 0x0F) << 4)
        qq = q.reshape(rows, nsb, 4, 2, 32)
        qs = (qq[:, :, :, 0] | (qq[:, :, :, 1] << 4)).reshape(rows, nsb, 128)
        return np.concatenate([f16_bytes(kb.d), f16_bytes(kb.dmin), a, b, c, qs], axis=-1).reshape(rows, -1)
    if qtype == QT.Q6_K:
        qq = q.reshape(rows, nsb, 2, 4, 32)
        low = qq & 0x0F
        ql = (low[:, :, :, 0:2] | (low[:, :, :, 2:4] << 4)).reshape(rows, nsb, 128)
        hi = (qq >> 4) & 0x03
        qh = (hi[:, :, :, 0] | (hi[:, :, :, 1] << 2) | (hi[:, :, :, 2] << 4) | (hi[:, :, :, 3] << 6))
        sc = kb.sc.reshape(rows, nsb, 16).astype(np.int8).view(np.uint8)
        return np.concatenate([ql, qh.reshape(rows, nsb, 64), sc, f16_bytes(kb.d)], axis=-1).reshape(rows, -1)
    raise ValueError(f"{qtype.name} is not a K-quant-file type")


def repack_k(raw: np.ndarray, qtype: QT) -> torch.Tensor:
    """raw GGUF rows [N, K / block * block bytes] -> [ceil(N / 16), K / group, group bytes] uint8 kernel
    tiles. Rows past N (to a whole tile) are zero weights."""
    kb = split_kblocks(raw, qtype)
    n, nb, _ = kb.q.shape
    n_pad = -(-n // TILE) * TILE
    tiles = n_pad // TILE

    def pad(x: np.ndarray | None) -> np.ndarray | None:
        if x is None or n_pad == n:
            return x
        return np.concatenate([x, np.zeros((n_pad - n, *x.shape[1:]), x.dtype)])

    q = pad(kb.q)
    # [tile, col, block, group g of 4 K-steps, step j] -> [tile, block, g, col, j]
    q = q.reshape(tiles, TILE, nb, 8, 4).transpose(0, 2, 3, 1, 4)
    nibbles = ((q[:, :, :4] & 0x0F) | ((q[:, :, 4:] & 0x0F) << 4)).reshape(tiles, nb, 256)
    parts = [nibbles]
    if qtype in (QT.Q5_0, QT.Q5_1):
        bit4 = ((q >> 4) & 1).transpose(0, 1, 3, 4, 2)  # [tile, block, col, j, g]
        parts.append((bit4 << np.arange(8, dtype=np.uint8)).sum(axis=-1, dtype=np.uint8).reshape(tiles, nb, 64))
        parts.append(_per_column(pad(kb.d), tiles, 2))
        if qtype == QT.Q5_1:
            parts.append(_per_column(pad(kb.m), tiles, 2))
    elif qtype == QT.Q4_K:
        parts += [_per_column(pad(kb.sc), tiles, 1), _per_column(pad(kb.mn), tiles, 1)]
    else:
        hi2 = ((q >> 4) & 3).transpose(0, 1, 3, 4, 2)  # [tile, block, col, j, g]
        shifts = (2 * np.arange(4)).astype(np.uint8)
        for half in (hi2[..., :4], hi2[..., 4:]):
            parts.append((half << shifts).sum(axis=-1, dtype=np.uint8).reshape(tiles, nb, 64))
        sc = pad(kb.sc).reshape(n_pad, nb, 2)
        parts += [_per_column(sc[..., 0], tiles, 1), _per_column(sc[..., 1], tiles, 1)]
    records = np.concatenate(parts, axis=-1)  # [tiles, nb, block record bytes]
    assert records.shape[-1] == BLOCK_RECORD_BYTES[qtype]
    if HEADER_BYTES[qtype]:
        nsb = nb // 8
        second = pad(kb.dmin) if qtype == QT.Q4_K else np.zeros((n_pad, nsb), np.float16)
        header = np.concatenate([_per_column(pad(kb.d), tiles, 2), _per_column(second, tiles, 2)], axis=-1)
        records = np.concatenate([header, records.reshape(tiles, nsb, 8 * BLOCK_RECORD_BYTES[qtype])], axis=-1)
    packed = records.reshape(tiles, nb // BLOCKS_PER_GROUP[qtype], group_bytes(qtype))
    out = torch.empty(packed.shape, dtype=torch.uint8)  # torch's allocator aligns to 64 bytes
    out.numpy()[...] = packed
    return out


def _per_column(x: np.ndarray, tiles: int, itemsize: int) -> np.ndarray:
    """[N_pad, groups] values -> [tiles, groups, 16 * itemsize] uint8: each tile's 16 columns as bytes."""
    groups = x.shape[1]
    return np.ascontiguousarray(x.reshape(tiles, TILE, groups).transpose(0, 2, 1)).view(np.uint8) \
        .reshape(tiles, groups, TILE * itemsize)

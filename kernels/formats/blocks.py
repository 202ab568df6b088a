"""llama.cpp's weight blocks (Q4_0, Q4_1, Q8_0: 32 weights each) and their repacking into kernel tiles.

The GGUF stores a [rows, K] weight row by row, each row a run of blocks: Q4_0 = f16 d + 16 bytes of
nibbles (w = d * (q - 8)), Q4_1 = f16 d + f16 m + nibbles (w = d * q + m), Q8_0 = f16 d + 32 int8
(w = d * q); nibble byte j holds weight j in its low half and weight j + 16 in its high half.
`repack` turns that into the record layout kernels/quant_matmul.mojo streams: per 16-row tile and K
block, the unsigned quants interleaved for vpdpbusd, then the tile's 16 scales (and mins).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

QK = 32  # weights per block
TILE = 16  # output rows per kernel tile

# Types the kernel serves -> its kind code (kernels/quant_matmul.mojo) and tile record size in bytes.
KERNEL_KINDS = {QT.Q4_0: 0, QT.Q4_1: 1, QT.Q8_0: 2}
RECORD_BYTES = {QT.Q4_0: 288, QT.Q4_1: 320, QT.Q8_0: 544}
# The names `--quantization` and /health use.
NAMES = {QT.Q4_0: "q4_0", QT.Q4_1: "q4_1", QT.Q8_0: "q8_0"}


def split_blocks(raw: np.ndarray, qtype: QT) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """raw: [rows, K / 32 * block bytes] uint8 -> (q [rows, K/32, 32] uint8 unsigned quants: 0..15 for Q4,
    q + 128 for Q8_0; d [rows, K/32] float16; m [rows, K/32] float16 for Q4_1, else None)."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rows = raw.shape[0]
    blocks = np.ascontiguousarray(raw).reshape(rows, -1, type_size)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    if qtype == QT.Q8_0:
        q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return q, d, None
    start = 4 if qtype == QT.Q4_1 else 2
    nibbles = blocks[..., start:start + 16]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0] if qtype == QT.Q4_1 else None
    return q, d, m


def repack(raw: np.ndarray, qtype: QT) -> torch.Tensor:
    """raw GGUF rows [N, K / 32 * block bytes] -> [ceil(N / 16), K / 32, record bytes] uint8 kernel tiles.
    Rows past N (to a whole tile) are zero weights."""
    q, d, m = split_blocks(raw, qtype)
    n, nb, _ = q.shape
    n_pad = -(-n // TILE) * TILE
    if n_pad != n:
        pad = n_pad - n
        q = np.concatenate([q, np.full((pad, nb, QK), 128 if qtype == QT.Q8_0 else 0, np.uint8)])
        d = np.concatenate([d, np.zeros((pad, nb), np.float16)])
        m = None if m is None else np.concatenate([m, np.zeros((pad, nb), np.float16)])
    tiles = n_pad // TILE
    # [tile, row, block, group of 4 K-steps, step] -> [tile, block, group, row, step]
    q = q.reshape(tiles, TILE, nb, 8, 4).transpose(0, 2, 3, 1, 4)
    if qtype == QT.Q8_0:
        quants = q.reshape(tiles, nb, 512)
    else:
        quants = (q[:, :, :4] | (q[:, :, 4:] << 4)).reshape(tiles, nb, 256)
    parts = [quants, _tile_halves(d, tiles, nb)]
    if m is not None:
        parts.append(_tile_halves(m, tiles, nb))
    packed = np.concatenate(parts, axis=-1)
    assert packed.shape[-1] == RECORD_BYTES[qtype]
    out = torch.empty(packed.shape, dtype=torch.uint8)  # torch's allocator aligns to 64 bytes; numpy's may not
    out.numpy()[...] = packed
    return out


def _tile_halves(x: np.ndarray, tiles: int, nb: int) -> np.ndarray:
    """[N_pad, nb] float16 -> [tiles, nb, 32] uint8: each tile's 16 values for a block, as bytes."""
    return np.ascontiguousarray(x.reshape(tiles, TILE, nb).transpose(0, 2, 1)).view(np.uint8)


def quantize_rows(weight: torch.Tensor, qtype: QT) -> np.ndarray:
    """[N, K] weight -> GGUF rows of qtype, by llama.cpp's reference quantizer (gguf.quants: round to
    nearest per 32-weight block, from float32)."""
    return quantize(weight.detach().float().numpy(), qtype)

"""The matmul for the types of K-quant files (kernels/quant_kmatmul.mojo: Q5_0, Q5_1, Q4_K, Q6_K) against
NumPy, on fresh random blocks every run.

Two references, as for the Q4_0/Q4_1/Q8_0 kernel: the kernel's own block arithmetic done exactly in
NumPy (int64 dot products, float32 epilogue; only fused multiply-adds differ, so the tolerance is
tight), and gguf.quants' dequantization with a float64 matmul, off by at most the activations' rounding
(a bound computed per output), in both activation modes (two int8 parts, "int8x2"; one, "int8").
Blocks come two ways: uniformly random quants and scales
(every bit pattern of the format), and round-to-nearest encodings of float weights. Outputs are
poisoned with NaN first. Also: the block codec against gguf.quants' decoder, the tile layout decoded
independently, batch and thread invariance, and bad arguments raising before the kernel.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

from kernels import quant_kmatmul
from kernels.formats.kblocks import KQUANT_KINDS, pack_kblocks, repack_k, split_kblocks
from kernels.quant_operands import ACTIVATION_MODES
from kernels.reference.quant_kmatmul import qkmatmul_blocks
from kernels.reference.quant_matmul import activation_error_bound, dequantized_matmul
from tests.helpers.quant_extremes import full_scale_activations
from worker.quant.kencode import quantize_k, random_kblocks

TYPES = [QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q6_K]
MODES = list(ACTIVATION_MODES)
# (M, N, K): decode rows, odd row counts around the 4-row groups, N not a multiple of the 16-row tile;
# K-quants need K % 256 == 0, Q5_x only K % 32 == 0 (the SmolLM2-width fallback: 576).
SHAPES = {
    "k": [(1, 40, 256), (3, 17, 512), (5, 33, 256), (7, 1, 768), (13, 50, 1024), (1, 1024, 1024), (33, 96, 512),
          (70, 48, 256)],
    "q5": [(1, 40, 96), (3, 17, 32), (5, 33, 64), (7, 1, 160), (13, 50, 576), (1, 576, 576), (33, 96, 1536)],
}


@pytest.fixture(scope="module")
def module():
    return quant_kmatmul.load()


def _shapes(qtype: QT):
    return SHAPES["k" if qtype in (QT.Q4_K, QT.Q6_K) else "q5"]


def _case(seed: int, m: int, n: int, k: int, qtype: QT, encoded: bool):
    rng = np.random.default_rng(seed)
    if encoded:
        w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 1.0, (n, 1))).astype(np.float32)
        w[:, :32] *= rng.integers(0, 2)  # sometimes an all-zero block
        raw = quantize_k(w, qtype)
    else:
        raw = random_kblocks(rng, n, k, qtype, scale=float(rng.uniform(0.01, 1.0)))
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 5.0, (m, 1))).astype(np.float32)
    if k >= 64:
        x[0, 32:64] = 0.0  # an all-zero activation block
    return x, raw, rng.standard_normal(n).astype(np.float32)


def _run(module, x: np.ndarray, packed, qtype: QT, n: int, bias=None, threading="omp",
         dtype=torch.float32, out_dtype=torch.float32, activations="int8x2") -> np.ndarray:
    out = torch.full((x.shape[0], n), float("nan"), dtype=out_dtype)
    quant_kmatmul.qmatmul_k(module, torch.from_numpy(x).to(dtype), packed, KQUANT_KINDS[qtype], n,
                           bias=None if bias is None else torch.from_numpy(bias), out_dtype=out_dtype, out=out,
                           threading=threading, activations=activations)
    return out.float().numpy()


CASES = [(q, s, e) for q in TYPES for s in _shapes(q) for e in (False, True)]


@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize(("qtype", "shape", "encoded"), CASES,
                         ids=[f"{q.name}-{'x'.join(map(str, s))}-{'rtn' if e else 'random'}" for q, s, e in CASES])
def test_matches_block_arithmetic_and_dequantized_matmul(module, qtype, shape, encoded, activations, test_seed):
    m, n, k = shape
    x, raw, bias = _case(test_seed, m, n, k, qtype, encoded)
    packed = repack_k(raw, qtype)
    w = dequantize(raw, qtype)
    for use_bias in (False, True):
        b = bias if use_bias else None
        ours = _run(module, x, packed, qtype, n, b, activations=activations)
        assert np.isfinite(ours).all()
        exact = qkmatmul_blocks(x, raw, qtype, b, activations)
        scale = np.abs(x).max() * np.abs(w).sum(axis=1).max() + 1.0
        np.testing.assert_allclose(ours, exact, rtol=1e-5, atol=1e-6 * scale)
        full = dequantized_matmul(x, raw, qtype) + (0 if b is None else b)
        assert (np.abs(ours - full) <= activation_error_bound(x, raw, qtype, activations)).all()


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_block_codec_matches_gguf(qtype, test_seed):
    """split_kblocks decodes what gguf.quants decodes, and pack_kblocks writes it back byte for byte."""
    rng = np.random.default_rng(test_seed)
    k = 512
    raw = random_kblocks(rng, 9, k, qtype)
    kb = split_kblocks(raw, qtype)
    assert np.array_equal(pack_kblocks(kb, qtype), raw)
    q = kb.q.astype(np.float32).reshape(9, k)
    f32 = np.float32
    if qtype == QT.Q5_0:
        w = np.repeat(kb.d.astype(f32), 32, axis=1) * (q - 16)
    elif qtype == QT.Q5_1:
        w = np.repeat(kb.d.astype(f32), 32, axis=1) * q + np.repeat(kb.m.astype(f32), 32, axis=1)
    elif qtype == QT.Q4_K:
        d = np.repeat(kb.d.astype(f32), 8, axis=1) * kb.sc.astype(f32)
        mn = np.repeat(kb.dmin.astype(f32), 8, axis=1) * kb.mn.astype(f32)
        w = np.repeat(d, 32, axis=1) * q - np.repeat(mn, 32, axis=1)
    else:
        d = np.repeat(kb.d.astype(f32), 16, axis=1) * kb.sc.astype(f32)
        w = np.repeat(d, 16, axis=1) * (q - 32)
    np.testing.assert_array_equal(w, dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_round_to_nearest_encoders_round_trip(qtype, test_seed):
    """The encoders' blocks decode (by gguf.quants) to within a fraction of a quantization step."""
    rng = np.random.default_rng(test_seed)
    w = rng.standard_normal((24, 512)).astype(np.float32)
    back = dequantize(quantize_k(w, qtype), qtype)
    rel = np.abs(back - w).mean() / np.abs(w).mean()
    print(f"{qtype.name}: mean relative error {rel:.4f}")
    assert rel < {QT.Q5_0: 0.06, QT.Q5_1: 0.06, QT.Q4_K: 0.12, QT.Q6_K: 0.03}[qtype]


def _decode_tiles(tiles: np.ndarray, qtype: QT) -> np.ndarray:
    """The weights, read from the tile records by the layout kernels/quant_kmatmul.mojo documents."""
    nt, ng, _ = tiles.shape
    bpg, hdr = (8, 64) if qtype in (QT.Q4_K, QT.Q6_K) else (1, 0)
    blk_bytes = {QT.Q5_0: 352, QT.Q5_1: 384, QT.Q4_K: 288, QT.Q6_K: 416}[qtype]
    header = tiles[..., :hdr].copy().view(np.float16).astype(np.float32)  # [nt, ng, 32]
    blocks = tiles[..., hdr:].reshape(nt, ng, bpg, blk_bytes)
    nib = blocks[..., :256].reshape(nt, ng, bpg, 4, 16, 4)
    q = np.concatenate([nib & 0xF, nib >> 4], axis=3).astype(np.int64)  # [nt, ng, bpg, g, col, j]
    g = np.arange(8).reshape(8, 1, 1)
    if qtype in (QT.Q5_0, QT.Q5_1):
        h = blocks[..., 256:320].reshape(nt, ng, bpg, 1, 16, 4).astype(np.int64)
        q |= ((h >> g) & 1) << 4
    if qtype == QT.Q6_K:
        h = np.concatenate([blocks[..., 256:320].reshape(nt, ng, bpg, 1, 16, 4)] * 4
                           + [blocks[..., 320:384].reshape(nt, ng, bpg, 1, 16, 4)] * 4, axis=3).astype(np.int64)
        q |= ((h >> (2 * (g % 4))) & 3) << 4
    q = q.astype(np.float32)
    if qtype == QT.Q5_0:
        scale = blocks[..., 320:352].copy().view(np.float16).astype(np.float32)  # [nt, ng, 1, 16]
        w = q * scale[:, :, :, None, :, None] - 16 * scale[:, :, :, None, :, None]
    elif qtype == QT.Q5_1:
        d = blocks[..., 320:352].copy().view(np.float16).astype(np.float32)[:, :, :, None, :, None]
        m = blocks[..., 352:384].copy().view(np.float16).astype(np.float32)[:, :, :, None, :, None]
        w = q * d + m
    elif qtype == QT.Q4_K:
        d = header[..., None, :16] * blocks[..., 256:272].astype(np.float32)
        mn = header[..., None, 16:] * blocks[..., 272:288].astype(np.float32)
        w = q * d[:, :, :, None, :, None] - mn[:, :, :, None, :, None]
    else:
        sc = blocks[..., 384:416].view(np.int8).astype(np.float32).reshape(nt, ng, bpg, 2, 16)
        d = header[..., None, None, :16] * sc  # [nt, ng, bpg, half, col]
        d = np.repeat(d, 4, axis=3)  # groups 0-3 use the first half's scale
        w = d[..., None] * (q - 32)
    # [nt, ng, bpg, g, col, j] -> [nt * 16, K]
    return w.transpose(0, 4, 1, 2, 3, 5).reshape(nt * 16, ng * bpg * 32)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_repack_keeps_every_weight(qtype, test_seed):
    rng = np.random.default_rng(test_seed)
    n, k = 37, 512
    raw = random_kblocks(rng, n, k, qtype)
    w = _decode_tiles(repack_k(raw, qtype).numpy(), qtype)
    np.testing.assert_array_equal(w[:n], dequantize(raw, qtype))
    assert not w[n:].any()  # padding rows are zero weights


@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_bfloat16_activations(module, qtype, activations, test_seed):
    x, raw, bias = _case(test_seed, 6, 80, 256, qtype, encoded=True)
    x_bf16 = torch.from_numpy(x).bfloat16()
    packed = repack_k(raw, qtype)
    ours = _run(module, x, packed, qtype, 80, bias, dtype=torch.bfloat16, out_dtype=torch.bfloat16,
                activations=activations)
    exact = qkmatmul_blocks(x_bf16.float().numpy(), raw, qtype, bias, activations)
    np.testing.assert_allclose(ours, torch.from_numpy(exact).bfloat16().float().numpy(), rtol=1e-2, atol=1e-3)
    ours_f32 = _run(module, x, packed, qtype, 80, bias, dtype=torch.bfloat16, activations=activations)
    np.testing.assert_allclose(ours_f32, exact, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_rows_are_batch_and_thread_invariant(module, qtype, activations, test_seed):
    """A row's result is the same bits alone, at any place in batches of any size, and on any thread."""
    x, raw, bias = _case(test_seed, 37, 200, 512, qtype, encoded=False)
    packed = repack_k(raw, qtype)
    run = functools.partial(_run, module, packed=packed, qtype=qtype, n=200, bias=bias, activations=activations)
    full = run(x)
    assert np.array_equal(full, run(x, threading="caller"))
    for i in (0, 5, 36):
        assert np.array_equal(run(x[i:i + 1])[0], full[i])
    for start, size in ((3, 4), (2, 7), (1, 9), (5, 11), (10, 27)):  # row groups of 8, 6, 4, 3, 2 and 1
        assert np.array_equal(run(x[start:start + size]), full[start:start + size])


def extreme_blocks(rng: np.random.Generator, n: int, k: int, qtype: QT) -> np.ndarray:
    """Rows whose quants and scales sit at the ends of their ranges, where the kernel's int32 sums are
    largest: every quant 0 or every quant at its maximum, per row; Q6_K's scales -128 or 127."""
    kb = split_kblocks(random_kblocks(rng, n, k, qtype), qtype)
    top = {QT.Q5_0: 31, QT.Q5_1: 31, QT.Q4_K: 15, QT.Q6_K: 63}[qtype]
    kb.q[:] = np.where(np.arange(n) % 2 == 0, 0, top).astype(np.uint8)[:, None, None]
    if qtype == QT.Q6_K:
        kb.sc[:] = np.where(np.arange(n) % 4 < 2, -128, 127).astype(np.int8)[:, None]
    if qtype == QT.Q4_K:
        kb.sc[:], kb.mn[:] = 63, 63
    return pack_kblocks(kb, qtype)


@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_extreme_blocks_keep_exact_integer_sums(module, qtype, activations, test_seed):
    """Activation blocks at full scale everywhere (|q| = 32258 for every element, of either sign; 127 in int8) against
    weights at the ends of their ranges: the largest integer sums the kernel makes (Q6_K's two scaled
    halves are 2^31 - 2^25 each) stay exact, so the kernel still matches both references."""
    rng = np.random.default_rng(test_seed)
    n, k = 24, 512
    raw = extreme_blocks(rng, n, k, qtype)
    x = full_scale_activations(rng, 4, k)
    ours = _run(module, x, repack_k(raw, qtype), qtype, n, activations=activations)
    np.testing.assert_allclose(ours, qkmatmul_blocks(x, raw, qtype, activations=activations), rtol=1e-5, atol=1e-5)
    bound = activation_error_bound(x, raw, qtype, activations)
    assert (np.abs(ours - dequantized_matmul(x, raw, qtype)) <= bound).all()


def test_reference_bound_is_tight_enough_to_fail(test_seed):
    """The float64 check can fail: Q6_K weights whose 16-weight scales are swapped within a block break it
    (the bug a wrong half-block pairing would make)."""
    rng = np.random.default_rng(test_seed)
    raw = random_kblocks(rng, 64, 256, QT.Q6_K)
    kb = split_kblocks(raw, QT.Q6_K)
    kb.sc = kb.sc.reshape(64, -1, 2)[..., ::-1].reshape(64, -1).copy()
    wrong = pack_kblocks(kb, QT.Q6_K)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    bad = qkmatmul_blocks(x, wrong, QT.Q6_K)
    assert not (np.abs(bad - dequantized_matmul(x, raw, QT.Q6_K)) <= activation_error_bound(x, raw, QT.Q6_K)).all()


def test_bad_arguments_raise_before_the_kernel(module):
    rng = np.random.default_rng(0)
    packed = repack_k(random_kblocks(rng, 20, 256, QT.Q4_K), QT.Q4_K)
    x = torch.ones(3, 256)
    kind = KQUANT_KINDS[QT.Q4_K]
    cases = [
        (dict(x=torch.ones(3, 96)), "K = 96"),
        (dict(x=torch.ones(3, 512)), "packed weights must be"),
        (dict(x=torch.ones(3, 256, dtype=torch.float16)), "unsupported dtype"),
        (dict(x=torch.ones(256, 3).t()), "contiguous"),
        (dict(packed=packed.view(-1)), "packed weights must be"),
        (dict(packed=torch.empty(packed.numel() + 1, dtype=torch.uint8)[1:].view(packed.shape)), "aligned"),
        (dict(n=40), "packed weights must be"),
        (dict(kind=KQUANT_KINDS[QT.Q6_K]), "packed weights must be"),  # Q6_K's records are larger
        (dict(kind=9), "unknown weight kind"),
        (dict(bias=torch.ones(21)), "bias"),
        (dict(out=torch.empty(3, 21)), "bad output"),
        (dict(out_dtype=torch.int32), "unsupported output dtype"),
        (dict(threading="pool"), "threading"),
        (dict(path="gpu"), "path"),
        (dict(activations="fp8"), "activations must be one of"),
    ]
    for overrides, message in cases:
        args = dict(x=x, packed=packed, kind=kind, n=20, bias=None, out_dtype=None, out=None, threading="omp",
                    path="auto", activations="int8")
        args.update(overrides)
        with pytest.raises(ValueError, match=message):
            quant_kmatmul.qmatmul_k(module, **args)

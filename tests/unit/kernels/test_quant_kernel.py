"""The quantized-weight matmul (kernels/quant_matmul.mojo) against NumPy, on fresh random blocks every run.

Two references, in both activation modes (two int8 parts, "int8x2", and one, "int8"): the kernel's own
block arithmetic done exactly in NumPy (int8 activations, int64 dot products, float32 epilogue: only fused
multiply-adds differ, so the tolerance is tight), and gguf.quants' dequantization with a float64 matmul,
off by at most the int8 activations' rounding (a bound computed per output and mode).
Outputs are poisoned with NaN first, so an element the kernel skips cannot pass. Also:
every row's result is bit-identical whatever the batch it is computed in, whichever thread runs it and
whichever path (vpdpbusd or AMX tiles) computes it, and bad arguments raise before the kernel runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from kernels import quant_matmul
from kernels.formats.blocks import KERNEL_KINDS, repack, split_blocks
from kernels.quant_operands import ACTIVATION_MODES, activation_addresses, activation_scratch_bytes, block_stride
from kernels.reference.quant_matmul import (activation_error_bound, dequantized_matmul, qmatmul_blocks,
                                            quantize_activations, split_activations)
from tests.helpers.quant_extremes import full_scale_activations

TYPES = [QT.Q4_0, QT.Q4_1, QT.Q8_0]
MODES = list(ACTIVATION_MODES)
# (M, N, K): decode rows, odd row counts around the 4-row groups, N not a multiple of the 16-row tile,
# single-block K, and the default model's shapes.
SHAPES = [(1, 40, 96), (3, 17, 32), (5, 33, 64), (7, 1, 160), (13, 50, 128), (1, 960, 576), (9, 576, 1536),
          (33, 3072, 576), (70, 48, 64)]


@pytest.fixture(scope="module")
def module():
    return quant_matmul.load()


def _case(seed: int, m: int, n: int, k: int, qtype: QT):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 1.0, (n, 1))).astype(np.float32)
    w[:, :32] *= rng.integers(0, 2)  # sometimes an all-zero block (scale 0)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 5.0, (m, 1))).astype(np.float32)
    if k >= 64:
        x[0, 32:64] = 0.0  # an all-zero activation block
    raw = quantize(w, qtype)
    return x, raw, rng.standard_normal(n).astype(np.float32)


def _run(module, x: np.ndarray, packed, qtype: QT, n: int, bias=None, threading="omp",
         dtype=torch.float32, out_dtype=torch.float32, path="auto", activations="int8x2") -> np.ndarray:
    out = torch.full((x.shape[0], n), float("nan"), dtype=out_dtype)
    quant_matmul.qmatmul(module, torch.from_numpy(x).to(dtype), packed, KERNEL_KINDS[qtype], n,
                       bias=None if bias is None else torch.from_numpy(bias), out_dtype=out_dtype, out=out,
                       threading=threading, path=path, activations=activations)
    return out.float().numpy()


@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_block_arithmetic_and_dequantized_matmul(module, qtype, shape, activations, test_seed):
    m, n, k = shape
    x, raw, bias = _case(test_seed, m, n, k, qtype)
    packed = repack(raw, qtype)
    for use_bias in (False, True):
        b = bias if use_bias else None
        ours = _run(module, x, packed, qtype, n, b, activations=activations)
        assert np.isfinite(ours).all()
        exact = qmatmul_blocks(x, raw, qtype, b, activations)
        # Same integer sums and float32 steps; only fused multiply-adds round differently.
        scale = np.abs(x).max() * np.abs(dequantize(raw, qtype)).sum(axis=1).max() + 1.0
        np.testing.assert_allclose(ours, exact, rtol=1e-5, atol=1e-6 * scale)
        full = dequantized_matmul(x, raw, qtype) + (0 if b is None else b)
        assert (np.abs(ours - full) <= activation_error_bound(x, raw, qtype, activations)).all()


def test_the_modes_are_told_apart(module, test_seed):
    """Each mode's result matches its own reference and not the other's: the tolerance above is far
    tighter than the gap between 8- and 15-bit activations, so a call in the wrong mode cannot pass."""
    x, raw, _ = _case(test_seed, 9, 64, 256, QT.Q8_0)
    packed = repack(raw, QT.Q8_0)
    one, two = (_run(module, x, packed, QT.Q8_0, 64, activations=mode) for mode in ("int8", "int8x2"))
    ref_one, ref_two = (qmatmul_blocks(x, raw, QT.Q8_0, activations=mode) for mode in ("int8", "int8x2"))
    scale = np.abs(x).max() * np.abs(dequantize(raw, QT.Q8_0)).sum(axis=1).max() + 1.0
    assert np.abs(one - ref_two).max() > 100 * 1e-6 * scale
    assert np.abs(two - ref_one).max() > 100 * 1e-6 * scale
    np.testing.assert_allclose(one, ref_one, rtol=1e-5, atol=1e-6 * scale)
    np.testing.assert_allclose(two, ref_two, rtol=1e-5, atol=1e-6 * scale)


def test_reference_bound_is_tight_enough_to_fail(test_seed):
    """The float64 check can fail: weights off by one quantization step break it."""
    x, raw, _ = _case(test_seed, 4, 64, 256, QT.Q8_0)
    q, d, _ = split_blocks(raw, QT.Q8_0)
    wrong = raw.copy().reshape(64, 8, 34)
    wrong[:, :, 2:] = (q.astype(np.int16) - 128 + 5).clip(-127, 127).astype(np.int8).view(np.uint8)
    bad = qmatmul_blocks(x, wrong.reshape(64, -1), QT.Q8_0)
    assert not (np.abs(bad - dequantized_matmul(x, raw, QT.Q8_0)) <= activation_error_bound(x, raw, QT.Q8_0)).all()


@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_bfloat16_activations(module, qtype, activations, test_seed):
    x, raw, bias = _case(test_seed, 6, 80, 192, qtype)
    x_bf16 = torch.from_numpy(x).bfloat16()
    ours = _run(module, x, repack(raw, qtype), qtype, 80, bias, dtype=torch.bfloat16, out_dtype=torch.bfloat16,
                activations=activations)
    exact = qmatmul_blocks(x_bf16.float().numpy(), raw, qtype, bias, activations)
    # bfloat16 output: one rounding of the float32 result.
    np.testing.assert_allclose(ours, torch.from_numpy(exact).bfloat16().float().numpy(), rtol=1e-2, atol=1e-3)
    ours_f32 = _run(module, x, repack(raw, qtype), qtype, 80, bias, dtype=torch.bfloat16, activations=activations)
    np.testing.assert_allclose(ours_f32, exact, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_rows_are_batch_and_thread_invariant(module, qtype, activations, test_seed):
    """A row's result is the same bits alone, at any place in batches of any size, and on any thread."""
    x, raw, bias = _case(test_seed, 37, 200, 320, qtype)
    packed = repack(raw, qtype)
    full = _run(module, x, packed, qtype, 200, bias, activations=activations)
    assert np.array_equal(full, _run(module, x, packed, qtype, 200, bias, threading="caller", activations=activations))
    for i in (0, 5, 36):
        assert np.array_equal(_run(module, x[i:i + 1], packed, qtype, 200, bias, activations=activations)[0], full[i])
    for start, size in ((3, 4), (2, 7), (1, 9), (10, 27)):  # row groups of 8, 4, 2 and 1
        part = _run(module, x[start:start + size], packed, qtype, 200, bias, activations=activations)
        assert np.array_equal(part, full[start:start + size])


def extreme_blocks(rng: np.random.Generator, n: int, k: int, qtype: QT) -> np.ndarray:
    """GGUF bytes of n rows whose quants are all at one end of their range, alternating rows (4-bit: 0 and 15;
    Q8_0: -128 and 127), with random scales (and Q4_1 minimums): where a block's integer sums are largest."""
    nb = k // 32
    d = rng.uniform(0.001, 0.1, (n, nb, 1)).astype(np.float16).view(np.uint8)
    if qtype == QT.Q8_0:
        quants = np.where(np.arange(n) % 2 == 0, -128, 127).astype(np.int8).view(np.uint8)[:, None, None]
        return np.concatenate([d, np.broadcast_to(quants, (n, nb, 32))], axis=2).reshape(n, -1)
    head = d if qtype == QT.Q4_0 else np.concatenate(
        [d, rng.uniform(-0.1, 0.0, (n, nb, 1)).astype(np.float16).view(np.uint8)], axis=2)
    quants = np.where(np.arange(n) % 2 == 0, 0x00, 0xFF).astype(np.uint8)[:, None, None]
    return np.concatenate([head, np.broadcast_to(quants, (n, nb, 16))], axis=2).reshape(n, -1)


@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_extreme_blocks_keep_exact_integer_sums(module, qtype, activations, test_seed):
    """Activation blocks at full scale everywhere (every int8 part at 127 in magnitude, of either sign) against
    quants at the ends of their range: the largest sums a block makes stay exact, so the kernel still matches the
    block arithmetic. A CPU without AVX-512 VNNI adds 4-bit pair sums in 16-bit lanes (8 x 2 x 15 x 127 = 30480 <
    2^15) and multiplies 8-bit quants as magnitude and sign (2 x 128 x 127 = 32512 < 2^15 a pair)."""
    rng = np.random.default_rng(test_seed)
    n, k = 24, 512
    raw = extreme_blocks(rng, n, k, qtype)
    x = full_scale_activations(rng, 7, k)
    ours = _run(module, x, repack(raw, qtype), qtype, n, activations=activations)
    scale = np.abs(x).max() * np.abs(dequantize(raw, qtype)).sum(axis=1).max() + 1.0  # as the test above
    np.testing.assert_allclose(ours, qmatmul_blocks(x, raw, qtype, activations=activations), rtol=1e-5,
                               atol=1e-6 * scale)
    assert (np.abs(ours - dequantized_matmul(x, raw, qtype)) <= activation_error_bound(x, raw, qtype, activations)).all()


def test_per_block_arrays_never_put_consecutive_blocks_in_one_cache_set():
    """The per-block activation arrays' stride (rows between block b's values and block b + 1's): at least the
    rows, whole groups of 16 rows for the AMX path, an odd count of 64-byte lines so that a power-of-two row
    count (a 2048-row prefill) does not put every block in one cache set, and inside the scratch."""
    for m in (1, 15, 16, 17, 32, 1000, 1024, 2032, 2047, 2048, 4096):
        stride = block_stride(m)
        assert stride >= m and stride % 16 == 0 and (stride // 16) % 2 == 1, (m, stride)
        for k in (32, 576, 1536):
            base = 1 << 20
            q1, q2, d, s, s_f, s_lo, got = activation_addresses(base, m, k)
            assert got == stride and s - d == s_f - s == s_lo - s_f == 4 * stride * (k // 32)
            assert s_lo + 4 * stride * (k // 32) <= base + activation_scratch_bytes(m, k)


def test_power_of_two_row_counts_give_the_same_bits(module, test_seed):
    """Rows run in a 1024-row call (padded per-block stride) get the bits they get in small calls."""
    x, raw, bias = _case(test_seed, 1024, 40, 96, QT.Q4_1)
    packed = repack(raw, QT.Q4_1)
    for activations in MODES:
        full = _run(module, x, packed, QT.Q4_1, 40, bias, activations=activations)
        for start in (0, 511, 1016):
            part = _run(module, x[start:start + 8], packed, QT.Q4_1, 40, bias, activations=activations)
            assert np.array_equal(part, full[start:start + 8])


@pytest.mark.skipif(not quant_matmul.amx_available(), reason="the CPU has no AMX int8 tiles (or Linux refused them)")
@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_amx_tiles_give_the_vnni_bits(module, qtype, activations, test_seed):
    """The many-row path (AMX int8 tiles, whole groups of 16 rows, the rest by vpdpbusd) gives every row
    the same bits as the one-row vpdpbusd GEMV, in float32 and bfloat16, with and without bias; fresh
    random inputs, odd shapes (a partial column tile, K of one block, row counts around 16)."""
    for i, (m, n, k) in enumerate([(16, 16, 32), (17, 33, 64), (35, 200, 320), (64, 77, 1536), (130, 50, 96)]):
        x, raw, bias = _case(test_seed + i, m, n, k, qtype)
        packed = repack(raw, qtype)
        for b, dtype in ((None, torch.float32), (bias, torch.bfloat16)):
            amx = _run(module, x, packed, qtype, n, b, dtype=dtype, out_dtype=dtype, path="amx",
                       activations=activations)
            assert np.isfinite(amx).all()
            vnni = _run(module, x, packed, qtype, n, b, dtype=dtype, out_dtype=dtype, path="vnni",
                        activations=activations)
            assert np.array_equal(amx, vnni), (m, n, k)
            for r in (0, 15, m - 1):
                alone = _run(module, x[r:r + 1], packed, qtype, n, b, dtype=dtype, out_dtype=dtype, path="vnni",
                             activations=activations)
                assert np.array_equal(alone[0], amx[r]), (m, n, k, r)
        exact = qmatmul_blocks(x, raw, qtype, bias, activations)
        ours = _run(module, x, packed, qtype, n, bias, path="amx", activations=activations)
        scale = np.abs(x).max() * np.abs(dequantize(raw, qtype)).sum(axis=1).max() + 1.0
        np.testing.assert_allclose(ours, exact, rtol=1e-5, atol=1e-6 * scale)


@pytest.mark.skipif(not quant_matmul.amx_available(), reason="the CPU has no AMX int8 tiles (or Linux refused them)")
@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_amx_row_chunks_give_the_vnni_bits(module, qtype, activations, test_seed):
    """A wide K makes the AMX path run its rows in several chunks (as many whole 16-row groups as keep
    512 KiB of q1 and q2 in cache: 32 rows at K = 8192, 80 at K = 3072), each tile's weights unpacked
    once per chunk, the M % 16 rows last by vpdpbusd. Several column tiles per thread, so a chunk that
    reused the previous chunk's unpacked weights would compute with another tile's."""
    # (M, N, K): three whole chunks and a 4-row tail; two whole chunks, a partial one and an 8-row tail.
    for i, (m, n, k) in enumerate([(100, 72, 8192), (200, 49, 3072)]):
        x, raw, bias = _case(test_seed + i, m, n, k, qtype)
        packed = repack(raw, qtype)
        for b, dtype in ((bias, torch.bfloat16), (None, torch.float32)):
            amx = _run(module, x, packed, qtype, n, b, dtype=dtype, path="amx", activations=activations)  # f32 out
            assert np.isfinite(amx).all()
            vnni = _run(module, x, packed, qtype, n, b, dtype=dtype, path="vnni", activations=activations)
            assert np.array_equal(amx, vnni), (m, n, k, dtype)
            for r in (0, 31, 32, 79, 80, 95, 96, 160, 191, m - 1):
                if r < m:
                    alone = _run(module, x[r:r + 1], packed, qtype, n, b, dtype=dtype, path="vnni",
                                 activations=activations)
                    assert np.array_equal(alone[0], amx[r]), (m, k, r, dtype)


def test_repack_keeps_every_weight(test_seed):
    """Unpacking the tiles by the kernel's documented layout gives back gguf.quants' dequantized weights."""
    rng = np.random.default_rng(test_seed)
    for qtype in TYPES:
        n, k = 37, 96
        raw = quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
        tiles = repack(raw, qtype).numpy()  # [tiles, nb, record]
        nt, nb = tiles.shape[:2]
        qbytes = 512 if qtype == QT.Q8_0 else 256
        if qtype == QT.Q8_0:
            q = tiles[..., :512].reshape(nt, nb, 8, 16, 4).astype(np.float32) - 128
        else:
            nib = tiles[..., :256].reshape(nt, nb, 4, 16, 4)
            q = np.concatenate([nib & 0xF, nib >> 4], axis=2).astype(np.float32) - (8 if qtype == QT.Q4_0 else 0)
        q = q.transpose(0, 3, 1, 2, 4).reshape(nt * 16, nb * 32)  # [rows, K]
        halves = tiles[..., qbytes:].copy().view(np.float16).astype(np.float32)  # [nt, nb, 16 or 32]
        d = halves[..., :16].transpose(0, 2, 1).reshape(nt * 16, nb)
        w = q * np.repeat(d, 32, axis=1)
        if qtype == QT.Q4_1:
            w += np.repeat(halves[..., 16:].transpose(0, 2, 1).reshape(nt * 16, nb), 32, axis=1)
        np.testing.assert_array_equal(w[:n], dequantize(raw, qtype))
        assert not w[n:].any()  # padding rows are zero weights


def test_bad_arguments_raise_before_the_kernel(module):
    raw = quantize(np.ones((20, 64), np.float32), QT.Q4_1)
    packed = repack(raw, QT.Q4_1)
    x = torch.ones(3, 64)
    kind = KERNEL_KINDS[QT.Q4_1]
    cases = [
        (dict(x=torch.ones(3, 60)), "K = 60"),
        (dict(x=torch.ones(3, 96)), "packed weights must be"),
        (dict(x=torch.ones(3, 64, dtype=torch.float16)), "unsupported dtype"),
        (dict(x=torch.ones(64, 3).t()), "contiguous"),
        (dict(x=torch.ones(64)), "contiguous \\[rows, K\\]"),
        (dict(packed=packed.view(-1)), "packed weights must be"),
        (dict(packed=packed.to(torch.int8)), "packed weights must be"),
        (dict(packed=torch.empty(packed.numel() + 1, dtype=torch.uint8)[1:].view(packed.shape)), "aligned"),
        (dict(n=40), "packed weights must be"),
        (dict(kind=7), "unknown weight kind"),
        (dict(bias=torch.ones(20, dtype=torch.bfloat16)), "bias"),
        (dict(bias=torch.ones(21)), "bias"),
        (dict(out=torch.empty(3, 21)), "bad output"),
        (dict(out=torch.empty(3, 20, dtype=torch.bfloat16)), "bad output"),
        (dict(out_dtype=torch.int32), "unsupported output dtype"),
        (dict(threading="pool"), "threading"),
        (dict(path="gpu"), "path"),
        (dict(activations="int4"), "activations must be one of"),
    ]
    for overrides, message in cases:
        args = dict(x=x, packed=packed, kind=kind, n=20, bias=None, out_dtype=None, out=None, threading="omp",
                    path="auto", activations="int8x2")
        args.update(overrides)
        with pytest.raises(ValueError, match=message):
            quant_matmul.qmatmul(module, **args)


def test_activation_parts_fit_int8_and_reach_15_bits(test_seed):
    """Both int8 parts of the activations stay in [-127, 127] (what vpdpbusd's s8 operand holds), and
    d * (254 q1 + q2) is within half a 1/32258 step of max|x| from x."""
    rng = np.random.default_rng(test_seed)
    x = (rng.standard_normal((64, 256)) * np.exp(rng.uniform(-20, 20, (64, 1)))).astype(np.float32)
    x[0, :32] = 0.0
    x[1, 32:64] = np.float32(3.0)  # ties: every t is exactly 127
    x[2, :32] = np.arange(32, dtype=np.float32) - 15.5  # many half-way points
    q1, q2 = split_activations(x)
    q, d, s = quantize_activations(x)
    assert np.abs(q1).max() <= 127 and np.abs(q2).max() <= 127
    assert np.array_equal(254 * q1 + q2, q) and np.array_equal(s, q.sum(axis=-1))
    blocks = x.astype(np.float64).reshape(64, -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    err = np.abs(blocks - d[..., None].astype(np.float64) * q)
    assert (err <= amax * (0.5 / 32258 + 1e-6)).all()


def test_one_part_activations_are_llama_cpp_int8(test_seed):
    """int8: one int8 per activation, q = round-half-even(x * 127 / max|x|) in [-127, 127] (the block's
    largest reaching +-127), d = max|x| / 127, so d * q is within half a step (max|x| / 254) of x."""
    rng = np.random.default_rng(test_seed)
    x = (rng.standard_normal((64, 256)) * np.exp(rng.uniform(-20, 20, (64, 1)))).astype(np.float32)
    x[0, :32] = 0.0
    halves = np.arange(31, dtype=np.float32) - np.float32(15.5)  # -15.5 .. 14.5: every t a tie (max|x| = 127)
    x[2, :32] = np.concatenate([[np.float32(127)], halves])
    q, d, s = quantize_activations(x, "int8")
    assert [int(v) for v in q[2, 0, 1:]] == [round(float(v)) for v in halves]  # Python's round: half to even
    q1, _ = split_activations(x)
    assert np.array_equal(q, q1)  # the two-part mode's first part
    assert np.abs(q).max() <= 127 and np.array_equal(s, q.sum(axis=-1))
    blocks = x.astype(np.float64).reshape(64, -1, 32)
    amax = np.abs(blocks).max(axis=-1)
    assert (np.abs(q).max(axis=-1)[amax > 0] == 127).all()
    err = np.abs(blocks - d[..., None].astype(np.float64) * q)
    assert (err <= amax[..., None] * (0.5 / 127 + 1e-6)).all()

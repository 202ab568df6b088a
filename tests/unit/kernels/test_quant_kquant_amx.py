"""The K-quant-file matmul's AMX int8 tile path (kernels/quant_kmatmul.mojo, `_tiles_amx`) against its
vpdpbusd path: the same bits for every row, at every row count.

Both paths sum the same exact int32 dot products (Q6_K per 16-element half, on 16-wide tiles) and pass
them through one float epilogue, so a row's result must not depend on the path, on how many rows the
call has or where the row sits in it (batch invariance). Fresh random blocks every run, outputs poisoned
with NaN, odd column counts (a partial 16-column tile), float32 and bfloat16, bias and none, row counts
below, at and far beyond the 16-row tile (AMX_MIN_ROWS), the integer-exact NumPy reference, and the
largest integer sums the formats allow. Skipped where the CPU has no AMX int8 tiles.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from kernels import quant_kmatmul as mojo_quant_k
from kernels import quant_matmul
from kernels.formats.kblocks import KQUANT_KINDS, repack_k
from kernels.quant_operands import ACTIVATION_MODES
from kernels.reference.quant_kmatmul import qkmatmul_blocks
from tests.unit.kernels.test_quant_kquant_kernel import extreme_blocks
from worker.quant.kencode import quantize_k, random_kblocks

pytestmark = pytest.mark.skipif(not quant_matmul.amx_available(),
                                reason="the CPU has no AMX int8 tiles (or Linux refused them)")

TYPES = [QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q6_K]
MODES = list(ACTIVATION_MODES)  # two int8 activation parts or one: the same bits on both paths in each
ROW_COUNTS = [1, 15, 16, 17, 33, 64, 100]
# (N, K) per row count, in turn: N not a multiple of 16; K of one block (an odd block count: the AMX
# loop takes two blocks a turn) and of several super-blocks.
SIZES = {"k": [(40, 256), (33, 512), (77, 768), (16, 256), (200, 512), (1, 256), (50, 1024)],
         "q5": [(40, 96), (33, 32), (77, 576), (16, 64), (200, 160), (1, 32), (50, 1536)]}
# (activations, output) dtypes
DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)]


@pytest.fixture(scope="module")
def module():
    return mojo_quant_k.load()


def _sizes(qtype: QT) -> list[tuple[int, int]]:
    return SIZES["k" if qtype in (QT.Q4_K, QT.Q6_K) else "q5"]


def _case(seed: int, m: int, n: int, k: int, qtype: QT):
    rng = np.random.default_rng(seed)
    if seed % 2:
        raw = random_kblocks(rng, n, k, qtype, scale=float(rng.uniform(0.01, 1.0)))
    else:
        w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 1.0, (n, 1))).astype(np.float32)
        raw = quantize_k(w, qtype)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 5.0, (m, 1))).astype(np.float32)
    x[rng.integers(0, m), :32] = 0.0  # an all-zero activation block
    return x, raw, rng.standard_normal(n).astype(np.float32)


def _run(module, x: np.ndarray, packed, qtype: QT, n: int, bias, dtype, path: str,
         out_dtype: torch.dtype | None = None, activations: str = "int8x2") -> torch.Tensor:
    out = torch.full((x.shape[0], n), float("nan"), dtype=out_dtype or dtype)
    mojo_quant_k.qmatmul_k(module, torch.from_numpy(x).to(dtype), packed, KQUANT_KINDS[qtype], n,
                           bias=None if bias is None else torch.from_numpy(bias), out_dtype=out.dtype, out=out,
                           path=path, activations=activations)
    return out


@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_amx_tiles_give_the_vnni_bits_at_every_row_count(module, qtype, activations, test_seed):
    for i, (m, (n, k)) in enumerate(zip(ROW_COUNTS, _sizes(qtype))):
        x, raw, bias = _case(test_seed + i, m, n, k, qtype)
        packed = repack_k(raw, qtype)
        for b in (None, bias):
            for dtype, out_dtype in DTYPES:
                amx = _run(module, x, packed, qtype, n, b, dtype, "amx", out_dtype, activations)
                assert torch.isfinite(amx).all()
                vnni = _run(module, x, packed, qtype, n, b, dtype, "vnni", out_dtype, activations)
                assert torch.equal(amx, vnni), (qtype.name, m, n, k, b is not None, dtype, out_dtype)
        exact = qkmatmul_blocks(x, raw, qtype, bias, activations)
        ours = _run(module, x, packed, qtype, n, bias, torch.float32, "amx", activations=activations).numpy()
        scale = np.abs(x).max() * np.abs(exact).max() + 1.0
        np.testing.assert_allclose(ours, exact, rtol=1e-5, atol=1e-6 * scale)


@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_a_row_alone_equals_the_row_inside_a_64_row_amx_call(module, qtype, activations, test_seed):
    """Batch invariance across paths: "auto" runs a 64-row call on AMX tiles and a one-row call on
    vpdpbusd, and every row gets the same bits from both (also rows in the vpdpbusd tail of 70 rows)."""
    n, k = (72, 512) if qtype in (QT.Q4_K, QT.Q6_K) else (72, 320)
    x, raw, bias = _case(test_seed, 70, n, k, qtype)
    packed = repack_k(raw, qtype)
    assert quant_matmul.use_amx(64) and not quant_matmul.use_amx(1)
    for dtype in (torch.float32, torch.bfloat16):
        batch = _run(module, x[:64], packed, qtype, n, bias, dtype, "auto", activations=activations)
        tail = _run(module, x, packed, qtype, n, bias, dtype, "auto", activations=activations)
        assert torch.equal(tail[:64], batch)
        for r in (0, 1, 15, 16, 40, 63, 64, 69):
            alone = _run(module, x[r:r + 1], packed, qtype, n, bias, dtype, "auto", activations=activations)
            assert torch.equal(alone[0], tail[r]), (r, dtype)


@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_row_chunks_give_the_vnni_bits(module, qtype, activations, test_seed):
    """A wide K makes the AMX path run its rows in several chunks (as many rows as keep 512 KiB of
    activations in cache: 32 rows at K = 8192), each tile unpacked per chunk, the M % 16 rows last."""
    m, n, k = 100, 40, 8192
    x, raw, bias = _case(test_seed, m, n, k, qtype)
    packed = repack_k(raw, qtype)
    amx = _run(module, x, packed, qtype, n, bias, torch.bfloat16, "amx", torch.float32, activations)
    assert torch.equal(amx, _run(module, x, packed, qtype, n, bias, torch.bfloat16, "vnni", torch.float32, activations))
    for r in (0, 31, 32, 70, 95, 96, 99):
        alone = _run(module, x[r:r + 1], packed, qtype, n, bias, torch.bfloat16, "vnni", torch.float32, activations)
        assert torch.equal(alone[0], amx[r]), r


@pytest.mark.parametrize("activations", MODES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_amx_tiles_keep_the_largest_integer_sums_exact(module, qtype, activations, test_seed):
    """16 rows of full-scale activations (|q| = 32258 everywhere) against weights at the ends of their
    ranges: tdpbsud's sums equal vpdpbusd's and the reference's (Q6_K's halves are 2^31 - 2^25)."""
    rng = np.random.default_rng(test_seed)
    n, k = 24, 512
    raw = extreme_blocks(rng, n, k, qtype)
    signs = np.where(rng.integers(0, 2, (16, k // 32)) == 0, -1.0, 1.0)
    x = (np.repeat(signs, 32, axis=1) * rng.uniform(0.5, 3.0, (16, 1))).astype(np.float32)
    x[1] = np.abs(x[1])
    x[2] = -np.abs(x[2])
    packed = repack_k(raw, qtype)
    amx = _run(module, x, packed, qtype, n, None, torch.float32, "amx", activations=activations)
    assert torch.equal(amx, _run(module, x, packed, qtype, n, None, torch.float32, "vnni", activations=activations))
    np.testing.assert_allclose(amx.numpy(), qkmatmul_blocks(x, raw, qtype, activations=activations), rtol=1e-5,
                               atol=1e-5)


def test_the_prebuilt_call_carries_the_amx_switch(test_seed):
    """A K-quant projection's prebuilt call (what worker/runner/decode_program.py runs) names the AMX switch, set
    as use_amx says for its rows, so the program can patch it per step."""
    from worker.quant.linear import QuantLinear, kquant_module

    rng = np.random.default_rng(test_seed)
    n, k = 48, 256
    proj = QuantLinear(k, n, bias=False, dtype=torch.float32, device="cpu")
    proj.set_weight(repack_k(random_kblocks(rng, n, k, QT.Q4_K), QT.Q4_K), QT.Q4_K, kquant_module())
    proj.finish_loading()
    for rows in (1, 40):
        x, out = torch.zeros(rows, k), torch.empty(rows, n)
        (call,) = proj.prebuilt(x, out, torch.empty(proj.scratch_bytes(rows), dtype=torch.uint8))
        assert call.amx_param == mojo_quant_k.AMX_PARAM and call.rows_param == mojo_quant_k.ROWS_PARAM
        assert call.params[call.amx_param] == int(quant_matmul.use_amx(rows))

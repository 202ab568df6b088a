"""Both quantized matmuls (kernels/quant_matmul.mojo, incl. its AMX path, and kernels/quant_kmatmul.mojo)
writing into a column slice of a wider row-major output, as a fused projection's segments do (one block
type per slice): every element of the slice is the bits of the same call into a contiguous output, and
nothing outside the slice is touched (the wide output is poisoned with NaN first). Outputs whose rows
are not contiguous, or overlap, raise before the kernel runs. Fresh random blocks every run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

from kernels import quant_kmatmul, quant_matmul
from kernels.formats.blocks import KERNEL_KINDS, repack
from kernels.formats.kblocks import KQUANT_KINDS, repack_k
from worker.quant.kencode import random_kblocks

N = 40  # two full column tiles and a partial one
COL0, RIGHT = 13, 7  # the slice starts mid-tile of the wide output, which has 7 more columns after it
ROWS = (1, 5, 17, 35)  # around the 4-row groups and the AMX path's 16-row groups
PATHS = ["vnni", "amx"] if quant_matmul.amx_available() else ["vnni"]


def _weights(qtype: QT, k: int, rng: np.random.Generator) -> torch.Tensor:
    if qtype in KERNEL_KINDS:
        return repack(quantize(rng.standard_normal((N, k)).astype(np.float32), qtype), qtype)
    return repack_k(random_kblocks(rng, N, k, qtype, scale=0.1), qtype)


def _matmul(qtype: QT, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
            path: str) -> None:
    if qtype in KERNEL_KINDS:
        quant_matmul.qmatmul(quant_matmul.load(), x, packed, KERNEL_KINDS[qtype], N, bias=bias, out_dtype=out.dtype,
                           out=out, path=path)
    else:
        quant_kmatmul.qmatmul_k(quant_kmatmul.load(), x, packed, KQUANT_KINDS[qtype], N, bias=bias,
                               out_dtype=out.dtype, out=out)


CASES = [(q, p) for q in KERNEL_KINDS for p in PATHS] + [(q, "vnni") for q in KQUANT_KINDS]


@pytest.mark.parametrize(("qtype", "path"), CASES, ids=[f"{q.name}-{p}" for q, p in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_column_slice_gets_the_contiguous_bits(qtype, path, dtype, test_seed):
    rng = np.random.default_rng(test_seed)
    k = 256 if qtype in (QT.Q4_K, QT.Q6_K) else 96
    packed = _weights(qtype, k, rng)
    wide_bias = torch.from_numpy(rng.standard_normal(N + 9).astype(np.float32))
    for m in ROWS:
        x = torch.from_numpy((rng.standard_normal((m, k)) * 2).astype(np.float32)).to(dtype)
        for bias in (None, wide_bias[4:4 + N]):
            contiguous = torch.full((m, N), float("nan"), dtype=dtype)
            _matmul(qtype, x, packed, bias, contiguous, path)
            assert not contiguous.isnan().any()
            wide = torch.full((m, COL0 + N + RIGHT), float("nan"), dtype=dtype)
            _matmul(qtype, x, packed, bias, wide[:, COL0:COL0 + N], path)
            assert torch.equal(wide[:, COL0:COL0 + N], contiguous), m
            assert wide[:, :COL0].isnan().all() and wide[:, COL0 + N:].isnan().all(), f"{m} rows: wrote outside"


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_K], ids=lambda q: q.name)
def test_bad_output_strides_raise_before_the_kernel(qtype, test_seed):
    rng = np.random.default_rng(test_seed)
    k = 256
    packed = _weights(qtype, k, rng)
    x = torch.ones(3, k)
    storage = torch.full((3 * 2 * N,), float("nan"))
    cases = {
        "transposed": storage[:3 * N].view(N, 3).t(),  # column-major: strides (1, 3)
        "every other column": storage.view(3, 2 * N)[:, ::2],  # strides (80, 2)
        "overlapping rows": storage.as_strided((3, N), (N - 1, 1)),  # row stride < N
    }
    for name, out in cases.items():
        assert tuple(out.shape) == (3, N), name
        with pytest.raises(ValueError, match="bad output tensor"):
            _matmul(qtype, x, packed, None, out, "vnni")
        assert storage.isnan().all(), f"{name}: the kernel ran"

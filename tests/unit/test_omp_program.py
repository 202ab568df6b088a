"""kernels/omp_program.py: kernel calls prebuilt once as one OpenMP program, run with per-step row counts.

A norm, then a quantized matmul of its output (two phases sharing one parameter array, the first with no
barrier before it), then silu over the product: at every row count up to the buffers' capacity (AMX
tiles from 16 rows where the CPU has them) the program's outputs are the bits of the same kernels called
one by one through their checked entry points, on fresh random inputs.
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import quantize

from kernels import mojo_layers, mojo_ops, mojo_quant
from kernels.omp_program import ProgramBuilder
from worker.quant.blocks import KERNEL_KINDS, repack

CAPACITY, HIDDEN, INTER = 20, 64, 96


@pytest.fixture(scope="module")
def modules():
    team = mojo_ops.omp_team()
    if team is None:
        pytest.fail("the OpenMP bridge did not build (`make kernels` builds it)")
    return team, mojo_layers.load(), mojo_quant.load()


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q8_0], ids=lambda q: q.name)
def test_a_program_gives_the_bits_of_its_calls_one_by_one(modules, qtype, test_seed):
    team, layers, quant = modules
    g = torch.Generator().manual_seed(test_seed)
    weight = torch.randn(2 * INTER, HIDDEN, generator=g)
    packed = repack(quantize(weight.numpy(), qtype), qtype)
    bias = torch.randn(2 * INTER, generator=g)
    norm_w = torch.rand(HIDDEN, generator=g) + 0.5
    x = torch.full((CAPACITY, HIDDEN), float("nan"))
    h, y, act = (torch.full((CAPACITY, n), float("nan")) for n in (HIDDEN, 2 * INTER, INTER))
    scratch = torch.empty(mojo_quant.scratch_bytes(CAPACITY, HIDDEN), dtype=torch.uint8)

    builder = ProgramBuilder(team, ("rows", "amx"))
    builder.add(layers, "mili_rms_norm_range", mojo_layers.rms_norm_params(x, norm_w, 1e-6, None, h), "rows",
                {mojo_layers.RMS_NORM_ROWS_PARAM: "rows"})
    params = mojo_quant.qmatmul_params(h, packed, KERNEL_KINDS[qtype], 2 * INTER, bias, y, scratch)
    builder.add(quant, mojo_quant.ENTRIES[0], params, "rows",
                {mojo_quant.ROWS_PARAM: "rows", mojo_quant.AMX_PARAM: "amx"}, same_split=True)
    builder.add(quant, mojo_quant.ENTRIES[1], params, -(-2 * INTER // 16))
    builder.add(layers, "mili_silu_mul_range", mojo_layers.silu_mul_params(y, act), "rows",
                {mojo_layers.SILU_MUL_ROWS_PARAM: "rows"})
    program = builder.build()
    assert program.n_phases == 4

    for rows in (1, 5, 16, CAPACITY, 3):
        x[:rows] = torch.randn(rows, HIDDEN, generator=g) * 3
        program.run(rows, int(mojo_quant.use_amx(rows)))
        h_ref = mojo_layers.rms_norm(layers, x[:rows], norm_w, 1e-6)
        y_ref = mojo_quant.qmatmul(quant, h_ref, packed, KERNEL_KINDS[qtype], 2 * INTER, bias=bias)
        assert torch.equal(h[:rows], h_ref) and torch.equal(y[:rows], y_ref), rows
        assert torch.equal(act[:rows], mojo_layers.silu_mul(layers, y_ref)), rows


def test_a_builder_refuses_what_it_cannot_run(modules):
    team, layers, _ = modules
    x, out = torch.zeros(4, 16), torch.zeros(4, 16)
    params = mojo_layers.rms_norm_params(x, torch.ones(16), 1e-6, None, out)
    builder = ProgramBuilder(team, ("rows",))
    with pytest.raises(ValueError, match="same_split"):
        builder.add(layers, "mili_rms_norm_range", params, "rows", same_split=True)  # no phase before it
    builder.add(layers, "mili_rms_norm_range", params, "rows")
    with pytest.raises(ValueError, match="same_split"):
        builder.add(layers, "mili_rms_norm_range", params, 4, same_split=True)  # a different split
    with pytest.raises(ValueError, match="per-step value"):
        builder.add(layers, "mili_rms_norm_range", params, "tokens")
    with pytest.raises(ValueError, match="per-step value"):
        builder.add(layers, "mili_rms_norm_range", params, 4, {4: "tokens"})
    program = builder.build()
    with pytest.raises(ValueError, match="per-step values"):
        program.run()

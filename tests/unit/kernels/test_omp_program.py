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

from kernels import attention as mojo_attention
from kernels import layers as mojo_layers
from kernels import quant_matmul
from kernels.formats.blocks import KERNEL_KINDS, repack
from kernels.omp_program import ProgramBuilder
from kernels.quant_operands import OUTPUT_STRIDE_PARAM
from worker.quant.linear import QuantLinear, module_for

CAPACITY, HIDDEN, INTER = 20, 64, 96


@pytest.fixture(scope="module")
def modules():
    team = mojo_attention.omp_team()
    if team is None:
        pytest.fail("the OpenMP bridge did not build (`make kernels` builds it)")
    return team, mojo_layers.load(), quant_matmul.load()


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
    scratch = torch.empty(quant_matmul.scratch_bytes(CAPACITY, HIDDEN), dtype=torch.uint8)

    builder = ProgramBuilder(team, ("rows", "amx"))
    builder.add(layers, "mili_rms_norm_range", mojo_layers.rms_norm_params(x, norm_w, 1e-6, None, h), "rows",
                {mojo_layers.RMS_NORM_ROWS_PARAM: "rows"})
    params = quant_matmul.qmatmul_params(h, packed, KERNEL_KINDS[qtype], 2 * INTER, bias, y, scratch)
    builder.add(quant, quant_matmul.ENTRIES[0], params, "rows",
                {quant_matmul.ROWS_PARAM: "rows", quant_matmul.AMX_PARAM: "amx"}, same_split=True)
    builder.add(quant, quant_matmul.ENTRIES[1], params, -(-2 * INTER // 16), taken=True)  # tiles in chunks
    builder.add(layers, "mili_silu_mul_range", mojo_layers.silu_mul_params(y, act), "rows",
                {mojo_layers.SILU_MUL_ROWS_PARAM: "rows"})
    program = builder.build()
    assert program.n_phases == 4

    for rows in (1, 5, 16, CAPACITY, 3):
        x[:rows] = torch.randn(rows, HIDDEN, generator=g) * 3
        program.run(rows, int(quant_matmul.use_amx(rows)))
        h_ref = mojo_layers.rms_norm(layers, x[:rows], norm_w, 1e-6)
        y_ref = quant_matmul.qmatmul(quant, h_ref, packed, KERNEL_KINDS[qtype], 2 * INTER, bias=bias)
        assert torch.equal(h[:rows], h_ref) and torch.equal(y[:rows], y_ref), rows
        assert torch.equal(act[:rows], mojo_layers.silu_mul(layers, y_ref)), rows

    # Each phase run alone (the profiler's view, Program.time_phases) computes the same bits, labelled by its entry.
    h.fill_(float("nan")), y.fill_(float("nan")), act.fill_(float("nan"))
    seconds = program.time_phases(rows, int(quant_matmul.use_amx(rows)))
    assert len(seconds) == 4 and all(s > 0 for s in seconds)
    assert program.labels == ("mili_rms_norm_range", *quant_matmul.ENTRIES, "mili_silu_mul_range")
    assert torch.equal(h[:rows], h_ref) and torch.equal(y[:rows], y_ref)
    assert torch.equal(act[:rows], mojo_layers.silu_mul(layers, y_ref))


# A fused projection stored in three block types, each served by its own kernel (Q4_0 and Q8_0 by
# kernels/quant_matmul.mojo, Q6_K by kernels/quant_kmatmul.mojo), rows not multiples of the 16-column tile.
SEGMENTS = [(QT.Q6_K, 72), (QT.Q4_0, 40), (QT.Q8_0, 29)]
WIDE_K = 256  # Q6_K's super-blocks


def mixed_projection(g: torch.Generator, bias: bool) -> QuantLinear:
    from kernels.formats.kblocks import repack_k
    from worker.quant.kencode import quantize_k

    n = sum(rows for _, rows in SEGMENTS)
    proj = QuantLinear(WIDE_K, n, bias, torch.float32, device="cpu")
    segments = []
    for qtype, rows in SEGMENTS:
        w = torch.randn(rows, WIDE_K, generator=g).numpy()
        packed = repack(quantize(w, qtype), qtype) if qtype in KERNEL_KINDS else repack_k(quantize_k(w, qtype), qtype)
        segments.append((qtype, packed, rows, module_for(qtype)))
    proj.set_segments(segments)
    if bias:
        proj.bias.copy_(torch.randn(n, generator=g))
    proj.finish_loading()
    return proj


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_a_projection_of_several_block_types_runs_as_one_quantize_and_a_tile_phase_per_type(modules, bias,
                                                                                           test_seed):
    """QuantLinear.prebuilt of a mixed projection: the first segment's quantize phase serves every segment's
    tile phase (the kernels share the activation quantizer and scratch), each writing its columns of one
    output. At every row count the program gives the bits of the module path (one call per segment, then
    torch.cat), in float32 and bfloat16."""
    team = modules[0]
    g = torch.Generator().manual_seed(test_seed)
    proj = mixed_projection(g, bias)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.full((CAPACITY, WIDE_K), float("nan"), dtype=dtype)
        y = torch.full((CAPACITY, proj.out_features), float("nan"), dtype=dtype)
        scratch = torch.empty(proj.scratch_bytes(CAPACITY), dtype=torch.uint8)
        calls = proj.prebuilt(x, y, scratch)
        assert [c.tiles for c in calls] == [-(-rows // 16) for _, rows in SEGMENTS]
        col0s = [sum(rows for _, rows in SEGMENTS[:i]) for i in range(len(SEGMENTS))]
        assert [c.params[0] for c in calls] == [y[:, col0].data_ptr() for col0 in col0s]  # each its own columns
        assert all(c.params[OUTPUT_STRIDE_PARAM] == proj.out_features for c in calls)  # rows of the whole output
        builder = ProgramBuilder(team, ("rows", "amx"))
        builder.add(calls[0].module, calls[0].entries[0], calls[0].params, "rows", calls[0].patches())
        for call in calls:
            builder.add(call.module, call.entries[1], call.params, call.tiles, call.patches())
        program = builder.build()
        for rows in (1, 5, 17, CAPACITY, 3):
            y.fill_(float("nan"))
            x[:rows] = (torch.randn(rows, WIDE_K, generator=g) * 3).to(dtype)
            program.run(rows, int(quant_matmul.use_amx(rows)))
            assert torch.equal(y[:rows], proj(x[:rows])), (dtype, rows)
            assert y[rows:].isnan().all(), (dtype, rows)


def test_a_mixed_projection_refuses_a_bad_output_and_its_calls_share_their_activations(modules, test_seed):
    from kernels.quant_operands import ACTIVATION_PARAMS, same_activations

    proj = mixed_projection(torch.Generator().manual_seed(test_seed), bias=True)
    x = torch.zeros(4, WIDE_K)
    scratch = torch.empty(proj.scratch_bytes(4), dtype=torch.uint8)
    with pytest.raises(ValueError, match="output must be"):
        proj.prebuilt(x, torch.zeros(4, proj.out_features + 1), scratch)
    calls = proj.prebuilt(x, torch.zeros(4, proj.out_features), scratch)
    assert all(same_activations(calls[0].params, c.params) for c in calls)
    for i in ACTIVATION_PARAMS:  # any one activation slot differing: not shareable
        other = calls[1].params[:]
        other[i] += 64
        assert not same_activations(calls[0].params, other), i


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
    with pytest.raises(ValueError, match="neither may be taken"):
        builder.add(layers, "mili_rms_norm_range", params, "rows", same_split=True, taken=True)
    builder.add(layers, "mili_rms_norm_range", params, "rows", taken=True)
    with pytest.raises(ValueError, match="neither may be taken"):  # its items' threads are not known
        builder.add(layers, "mili_rms_norm_range", params, "rows", same_split=True)
    with pytest.raises(ValueError, match="per-step value"):
        builder.add(layers, "mili_rms_norm_range", params, "tokens")
    with pytest.raises(ValueError, match="per-step value"):
        builder.add(layers, "mili_rms_norm_range", params, 4, {4: "tokens"})
    program = builder.build()
    with pytest.raises(ValueError, match="per-step values"):
        program.run()


def test_a_phase_whose_shares_may_be_stolen_runs_every_item_once(modules, test_seed):
    """Shares with stealing (taken=True): whatever the threads' speeds, every row is normed exactly once, with
    the bits of the one-by-one call, at row counts from 1 (one thread idle) to many steps per share."""
    team, layers, _ = modules
    g = torch.Generator().manual_seed(test_seed)
    capacity = 700
    x = torch.randn(capacity, HIDDEN, generator=g) * 2
    weight = torch.rand(HIDDEN, generator=g) + 0.5
    out = torch.full((capacity, HIDDEN), float("nan"))
    builder = ProgramBuilder(team, ("rows",))
    builder.add(layers, "mili_rms_norm_range", mojo_layers.rms_norm_params(x, weight, 1e-6, None, out), "rows",
                {mojo_layers.RMS_NORM_ROWS_PARAM: "rows"}, taken=True)
    program = builder.build()
    for rows in (1, 2, 3, 17, 250, capacity):
        out.fill_(float("nan"))
        for _ in range(3):
            program.run(rows)
        assert torch.equal(out[:rows], mojo_layers.rms_norm(layers, x[:rows], weight, 1e-6)), rows
        assert out[rows:].isnan().all(), rows  # nothing past the step's rows

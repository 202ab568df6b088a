"""The machine-peak loops (loadtest/machine_peak.mojo) run exactly the work loadtest/peaks.py counts: their sums
are checked against the products and bytes they are said to do, so a rate read off them means what it says. And
bench_quant's table against the peaks shares each figure out of the ceiling its column names."""

from __future__ import annotations

import argparse
import array

import numpy as np
import pytest
import torch

from kernels import quant_matmul
from kernels.builder.target import cpu_flags
from loadtest import bench_quant, peaks

# The int8 loop times vpdpbusd's integers as the quantized matmuls compute them on this CPU (AVX-512 VNNI, or AVX2's
# multiply-adds); the bfloat16 loop needs AVX-512 BF16 (an AVX2-only AMD Zen 3 has no such peak to measure).
needs_bf16 = pytest.mark.skipif("avx512_bf16" not in cpu_flags(), reason="this CPU has no AVX-512 BF16")


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    return peaks.build(tmp_path_factory.mktemp("peak"))


def run(module, kind: int, iterations: int, buffer: int = 0, size: int = 0) -> int:
    sink = array.array("q", [0])
    params = array.array("q", [kind, iterations, sink.buffer_info()[0], buffer, size])
    module.peak((params.buffer_info()[0],))
    return sink[0]


def wrapped(value: int) -> int:
    return (value + 2**31) % 2**32 - 2**31  # the loops' int32 lanes wrap


def test_int8_loop_runs_its_vpdpbusd_count(module):
    # Work item 0: unsigned bytes 1, signed bytes 7; each vpdpbusd adds 4 products of 7 to each of 16 lanes.
    for iterations in (1, 3, 50):
        assert run(module, peaks.KINDS["int8 vpdpbusd"].number, iterations) == iterations * module.chains(()) * 16 * 4 * 7


def test_read_loop_reads_every_byte_it_is_given(module):
    data = torch.randint(0, 256, (3 * 4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    words = data.numpy().view(np.int32).astype(np.int64)
    got = run(module, peaks.READ_KIND, 2, data.data_ptr(), data.numel())
    assert got == wrapped(2 * int(words.sum()))


def test_int8_pairs_loop_runs_its_vpmaddubsw_count(module):
    # Item 0: each vpmaddubsw adds 2 products of 7 to each of 16 int16 lanes, in 2 x CHAINS chains (no lane wraps).
    for iterations in (1, 3, 50):
        assert run(module, peaks.KINDS["int8 vpmaddubsw"].number, iterations) == iterations * 2 * module.chains(()) * 16 * 2 * 7


@pytest.mark.parametrize("name, per_iteration", [pytest.param("bf16 vdpbf16ps", 2 * 16, marks=needs_bf16),
                                                 ("fp32 fma", 16)])
def test_float_loops_accumulate_their_products(module, name, per_iteration):
    # Item 0: a = 0.001, b = 0.002 (bfloat16 or float32); the sum is truncated to an integer, so run enough.
    chains = module.chains(())
    iterations = 20_000_000 // (chains * per_iteration)
    expected = iterations * chains * per_iteration * 0.001 * 0.002
    got = run(module, peaks.KINDS[name].number, iterations)
    assert abs(got - expected) <= 0.02 * expected + 1, (name, got, expected)


@pytest.mark.skipif(not quant_matmul.amx_available(), reason="needs AMX int8 tiles (Intel Sapphire Rapids and later)")
def test_amx_loop_runs_its_tile_products(module):
    iterations = 3
    p = np.array([(1 + i) & 0x0F for i in range(1024)], dtype=np.int64)
    a = p[:16 * 32].reshape(16, 32)  # tile A1: 16 rows x 32 int8
    b = p[:8 * 64].reshape(8, 16, 4)  # tile B: 8 K-groups x 16 columns x 4 K, uint8
    c = iterations * np.einsum("rgj,gcj->rc", a.reshape(16, 8, 4), b)
    first_bytes = c[0, :4].astype("<i4").view(np.uint8).astype(np.int64)
    assert run(module, peaks.KINDS["int8 amx"].number, iterations) == int(first_bytes.sum())


# The dense linear's ceiling: vdpbf16ps's rate, or without AVX-512 BF16 (no such peak measured) the FMA rate.
@pytest.mark.parametrize("dense_kind", ["bf16 vdpbf16ps", "fp32 fma"])
def test_bench_quant_shares_figures_out_of_their_ceilings(dense_kind):
    fake = peaks.Peaks("test CPU", 2, {}, {"int8 vpdpbusd": 800e9, dense_kind: 400e9, "int8 amx": 4000e9},
                       20e9, 40e9)
    assert peaks.dense_ceiling(fake) == (dense_kind, 400e9)
    assert peaks.quant_ceiling(fake, "int8x2", False) == 400e9 and peaks.quant_ceiling(fake, "int8", False) == 800e9
    assert peaks.quant_ceiling(fake, "int8x2", True) == 2000e9
    args = argparse.Namespace(types=["Q8_0"], shapes=["o"], rows=[4], modes=["int8x2", "int8"], before=None,
                              rounds=1)
    lines = bench_quant.kernel_table(args, fake)
    first = next(line for line in lines if line.startswith("| o 576x576 | 4 |"))
    cells = [c.strip() for c in first.split("|")[1:-1]]
    bf16_gflops, int8x2_gops, int8_gops = float(cells[3]), float(cells[5]), float(cells[8])
    shares = next(line for line in lines[lines.index(first) + 1:] if line.startswith("| o 576x576 | 4 |"))
    bf16_share, int8x2_share, int8_share = [c.strip() for c in shares.split("|")[3:6]]
    for share, rate, top in ((bf16_share, bf16_gflops, 400), (int8x2_share, int8x2_gops, 400),
                             (int8_share, int8_gops, 800)):
        assert abs(float(share.rstrip("%")) - 100 * rate / top) <= 0.5 + 100 * 0.5 / top, (share, rate, top)

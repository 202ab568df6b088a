"""The CPU-checkable parts of the Mojo GPU attention path: build keys and lookup, the step plan's conversion to
Modular's conventions, argument checks, and the backend choice with its fallbacks. Nothing here builds the GPU
module (about a minute per shape; `make gpu-bundle` does) or needs a GPU (tests/gpu/test_mojo_attention_cuda.py
runs the module itself)."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from kernels import gpu_attention as gpu_mojo_ops
from kernels.builder import gpu_modules as gpu_build
from kernels.builder.gpu_modules import CARRIED_SHAPES, GpuShape
from kernels.gpu_attention import (TABLE_BASE_ALIGN, TABLE_TAIL_ENTRIES, GpuModuleUnavailable, GpuStepPlan,
                                   aligned_block_tables, module_table_width)
from worker.attention.selection import get_attention_backend

QWEN3_06B = GpuShape(16, 8, 128)


@pytest.fixture
def no_builds(tmp_path, monkeypatch):
    """An empty build root and no carried bundle: no GPU module is found."""
    monkeypatch.setattr(gpu_build, "GPU_BUILD_ROOT", tmp_path / "gpu")
    monkeypatch.delenv(gpu_build.CARRIED_DIR_ENV, raising=False)
    return tmp_path


def test_shapes_are_checked_before_any_build():
    assert QWEN3_06B.unsupported_reason() is None
    assert "do not group" in GpuShape(6, 4, 128).unsupported_reason()
    assert "head_dim 96" in GpuShape(4, 2, 96).unsupported_reason()
    with pytest.raises(gpu_build.KernelBuildError, match="head_dim 32"):
        gpu_build.build_module(GpuShape(4, 2, 32))  # refused without calling the compiler
    # The carried set covers GQA ratios 1, 2, 4 at both head dims, and Qwen3-0.6B.
    assert {s.num_heads // s.num_kv_heads for s in CARRIED_SHAPES} >= {1, 2, 4}
    assert {s.head_dim for s in CARRIED_SHAPES} == {64, 128} and QWEN3_06B in CARRIED_SHAPES
    assert all(s.unsupported_reason() is None for s in CARRIED_SHAPES)


def test_build_key_follows_shape_source_and_target(monkeypatch, tmp_path):
    keys = {gpu_build.build_key(s) for s in CARRIED_SHAPES}
    assert len(keys) == len(CARRIED_SHAPES)
    assert gpu_build.build_key(QWEN3_06B) == gpu_build.build_key(GpuShape(16, 8, 128))
    edited = tmp_path / "gpu_attention.mojo"
    edited.write_bytes(gpu_build.GPU_SOURCE.read_bytes() + b"\n# edited\n")
    before = gpu_build.build_key(QWEN3_06B)
    monkeypatch.setattr(gpu_build, "GPU_SOURCE", edited)
    assert gpu_build.build_key(QWEN3_06B) != before
    monkeypatch.setattr(gpu_build, "GPU_SOURCE", gpu_build.KERNELS_DIR / "gpu_attention.mojo")
    monkeypatch.setattr(gpu_build, "GPU_TARGET", "nvidia:90")
    assert gpu_build.build_key(QWEN3_06B) != before


def test_the_carried_bundle_is_searched_first(no_builds, monkeypatch):
    assert gpu_build.find_module(QWEN3_06B) is None
    local = gpu_build.module_path(QWEN3_06B)
    local.parent.mkdir(parents=True)
    local.write_bytes(b"local")
    assert gpu_build.find_module(QWEN3_06B) == local
    carried = gpu_build.module_path(QWEN3_06B, no_builds / "bundle")
    carried.parent.mkdir(parents=True)
    carried.write_bytes(b"carried")
    monkeypatch.setenv(gpu_build.CARRIED_DIR_ENV, str(no_builds / "bundle"))
    assert gpu_build.find_module(QWEN3_06B) == carried
    assert gpu_build.find_module(GpuShape(4, 2, 64)) is None  # another shape: another key


def test_a_missing_or_broken_module_is_unavailable_with_the_reason(no_builds):
    with pytest.raises(GpuModuleUnavailable, match="no GPU attention module built for 16q/8kv/d128"):
        gpu_mojo_ops.load_module(QWEN3_06B)
    broken = gpu_build.module_path(QWEN3_06B)
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not an ELF file")
    with pytest.raises(GpuModuleUnavailable, match="does not load"):
        gpu_mojo_ops.load_module(QWEN3_06B)


def test_only_bfloat16_and_16_token_blocks_are_served():
    assert gpu_mojo_ops.unsupported_reason(QWEN3_06B, torch.bfloat16, 16) is None
    assert "bfloat16 only" in gpu_mojo_ops.unsupported_reason(QWEN3_06B, torch.float32, 16)
    assert "16-token KV blocks" in gpu_mojo_ops.unsupported_reason(QWEN3_06B, torch.bfloat16, 8)
    assert "head_dim 32" in gpu_mojo_ops.unsupported_reason(GpuShape(4, 2, 32), torch.bfloat16, 16)


def _step(seqs, block_size=16, width=None):
    """MILI's metadata for (context length, query length) per sequence, as the model runner builds it."""
    ctx = tuple(c for c, _ in seqs)
    q = tuple(n for _, n in seqs)
    width = width or max(-(-c // block_size) for c in ctx)
    tables = torch.arange(len(seqs) * width, dtype=torch.int32).view(len(seqs), width)
    starts = torch.tensor([0] + [sum(q[:i + 1]) for i in range(len(q))], dtype=torch.int32)
    slots = torch.arange(sum(q), dtype=torch.int64)
    return tables, torch.tensor(ctx, dtype=torch.int32), starts, slots, ctx, q


def test_step_plan_converts_to_modulars_cache_lengths(test_seed):
    rng = random.Random(test_seed)
    seqs = [(rng.randint(1, 3000), 1) for _ in range(rng.randint(1, 6))]  # decode rows
    seqs += [(c, rng.randint(1, c)) for c in (rng.randint(1, 3000) for _ in range(rng.randint(1, 4)))]  # chunks
    rng.shuffle(seqs)
    tables, ctx, starts, slots, ctx_host, q_host = _step(seqs)
    plan = GpuStepPlan.build(tables, ctx, starts, slots, ctx_host, q_host, 16)
    # Modular counts the tokens cached BEFORE this step; MILI's context lengths include the step's tokens.
    assert plan.cache_lengths.tolist() == [c - n for c, n in seqs]
    assert plan.cache_lengths.dtype == torch.int32
    assert plan.row_offsets.tolist() == starts.tolist()
    width = tables.shape[1]
    assert torch.equal(plan.block_tables[:, :width], tables) and not plan.block_tables[:, width:].any()
    assert (plan.batch, plan.num_tokens) == (len(seqs), sum(n for _, n in seqs))
    assert plan.max_query_len == max(n for _, n in seqs) and plan.max_context_len == max(c for c, _ in seqs)


def test_block_table_rows_are_16_byte_aligned_for_the_module():
    """Modular's decode kernel reads table rows with 16-byte loads: a 19-block-wide table (76-byte rows) faulted
    on a GPU. Rows are padded to 8 entries on an aligned base, plus the 16-entry tail its prefill kernels' page
    look-up reads past the last page; a table already so laid out passes through untouched."""
    seqs = [(15, 1), (16, 1), (17, 1), (300, 1)]  # the faulting step: 19 pages wide
    tables, ctx, starts, slots, ctx_host, q_host = _step(seqs)
    assert tables.shape[1] == 19
    plan = GpuStepPlan.build(tables, ctx, starts, slots, ctx_host, q_host, 16)
    assert plan.block_tables.shape == (4, 24 + TABLE_TAIL_ENTRIES) and plan.block_tables.is_contiguous()
    assert plan.block_tables.stride(0) * 4 % 16 == 0 and plan.block_tables.data_ptr() % TABLE_BASE_ALIGN == 0
    assert torch.equal(plan.block_tables[:, :19], tables) and not plan.block_tables[:, 19:].any()
    wide = torch.zeros(4, module_table_width(19), dtype=torch.int32)
    wide[:, :19] = tables
    assert aligned_block_tables(wide, 19) is wide
    # Wider than the step needs (a captured decode graph's ladder width) but not a multiple of 8: padded to one.
    assert aligned_block_tables(torch.zeros(2, 45, dtype=torch.int32), 3).shape == (2, 48)
    # An aligned width on a misaligned base (a view 4 bytes into a buffer) is copied to an aligned base.
    width = module_table_width(19)
    buffer = torch.zeros(1 + 4 * width, dtype=torch.int32)
    shifted = buffer[1:].view(4, width)
    assert shifted.data_ptr() % 16 != 0
    moved = aligned_block_tables(shifted, 19)
    assert moved.data_ptr() % TABLE_BASE_ALIGN == 0 and torch.equal(moved, shifted)


def test_block_tables_hold_the_tail_the_prefill_look_up_reads():
    """Modular's PagedKVCache.populate loads up to 16 table entries from a key tile's first page: every row holds
    at least round_up(pages, 8) + 16 entries, the tail all block 0, whatever the step's shape."""
    for pages in (1, 3, 8, 9, 64, 257):
        tables = torch.arange(1, 2 * pages + 1, dtype=torch.int32).view(2, pages)
        padded = aligned_block_tables(tables, pages)
        assert padded.shape[1] % 8 == 0 and padded.shape[1] >= pages + 15
        assert padded.shape[1] == module_table_width(pages)
        assert torch.equal(padded[:, :pages], tables) and not padded[:, pages:].any()


def test_step_plan_refuses_what_the_kernel_would_misread():
    seqs = [(17, 1), (40, 7)]
    good = _step(seqs)
    GpuStepPlan.build(*good, 16)
    tables, ctx, starts, slots, ctx_host, q_host = good
    bad = {
        "16 tokens": lambda: GpuStepPlan.build(*good, 8),
        "query length <= context length": lambda: GpuStepPlan.build(tables, ctx, starts, slots, ctx_host, (1, 41), 16),
        "narrower than the contexts": lambda: GpuStepPlan.build(tables[:, :2], ctx, starts, slots, ctx_host,
                                                                 q_host, 16),
        "batch sizes disagree": lambda: GpuStepPlan.build(tables, ctx, starts, slots, ctx_host, q_host[:1], 16),
        "slot_mapping must be contiguous torch.int64": lambda: GpuStepPlan.build(
            tables, ctx, starts, slots.to(torch.int32), ctx_host, q_host, 16),
        "block_tables must be contiguous": lambda: GpuStepPlan.build(tables.t().contiguous().t(), ctx, starts,
                                                                     slots, ctx_host, q_host, 16),
        "slot_mapping must have 8 entries": lambda: GpuStepPlan.build(tables, ctx, starts, slots[:5], ctx_host,
                                                                      q_host, 16),
    }
    for message, call in bad.items():
        with pytest.raises(ValueError, match=message):
            call()


def test_argument_checks_name_the_problem():
    s = GpuShape(4, 2, 64)
    k = torch.zeros(3, 16, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"caches must be \[blocks, 16, 2, 64\]"):
        gpu_mojo_ops._check_cache(k[:, :8], k[:, :8], s)
    with pytest.raises(ValueError, match="bfloat16"):
        gpu_mojo_ops._check_cache(k.float(), k.float(), s)
    with pytest.raises(ValueError, match="contiguous"):
        gpu_mojo_ops._check_cache(k.transpose(0, 1).contiguous().transpose(0, 1), k, s)
    with pytest.raises(ValueError, match="one CUDA device"):
        gpu_mojo_ops._check_cache(k, k, s)  # everything right but the device
    rows = torch.zeros(5, 2, 64, dtype=torch.bfloat16)
    cpu = torch.device("cpu")
    gpu_mojo_ops._check_rows(rows, "key", 5, 2, 64, cpu)
    gpu_mojo_ops._check_rows(torch.zeros(5, 4, 64, dtype=torch.bfloat16)[:, 2:], "key", 5, 2, 64, cpu)  # strided
    for x, message in ((rows[:4], r"must be \[5, 2, 64\]"), (rows.float(), "bfloat16"),
                       (rows.transpose(1, 2).contiguous().transpose(1, 2), "contiguous within a token"),
                       (torch.zeros(5 * 128 + 1, dtype=torch.bfloat16)[1:].view(5, 2, 64), "16-byte aligned")):
        with pytest.raises(ValueError, match=message):
            gpu_mojo_ops._check_rows(x, "key", 5, 2, 64, cpu)


def test_cuda_backend_choice_and_its_fallbacks(no_builds, caplog):
    cuda = torch.device("cuda", 0)
    # Where the module cannot serve (here: none built), auto falls back to the torch reference and says why; mojo
    # fails with the reason.
    caplog.set_level(logging.WARNING)
    assert get_attention_backend("auto", cuda, QWEN3_06B, torch.bfloat16, 16).name == "torch"
    assert "falling back to the torch reference" in caplog.text and "no GPU attention module built" in caplog.text
    with pytest.raises(RuntimeError, match="no GPU attention module built for 16q/8kv/d128"):
        get_attention_backend("mojo", cuda, QWEN3_06B, torch.bfloat16, 16)
    with pytest.raises(RuntimeError, match="bfloat16 only"):
        get_attention_backend("mojo", cuda, QWEN3_06B, torch.float32, 16)
    with pytest.raises(RuntimeError, match="16-token KV blocks"):
        get_attention_backend("mojo", cuda, QWEN3_06B, torch.bfloat16, 32)
    with pytest.raises(RuntimeError, match="attention shape and dtype"):
        get_attention_backend("mojo", cuda)
    assert get_attention_backend("torch", cuda, QWEN3_06B, torch.bfloat16, 16).name == "torch"
    with pytest.raises(ValueError, match="CPU and CUDA only"):
        get_attention_backend("mojo", "mps")


def test_the_gpu_tests_tiny_models_have_carried_shapes():
    """tests/gpu/test_mojo_attention_cuda.py's engine tests need a built module for each model's shape."""
    from tests.gpu.test_mojo_attention_cuda import MOJO_TINY, tiny_shape

    assert {tiny_shape(name) for name in MOJO_TINY} <= set(CARRIED_SHAPES)
    assert {s.num_heads // s.num_kv_heads for s in map(tiny_shape, MOJO_TINY)} == {1, 2, 4}


def test_random_step_writes_each_new_token_into_its_own_page(test_seed):
    """The GPU self-check's and diagnose's random step (worker/attention/cuda.py), on the CPU: each new token's slot
    is its position in its own sequence's pages, the reference write touches those slots alone, and the plan's
    tables are the drawn tables padded for the module."""
    from worker.attention.cuda import RandomStep

    seqs = ((15, 1), (300, 1), (40, 7), (33, 33))
    step = RandomStep.draw(GpuShape(4, 2, 64), seqs, test_seed, torch.device("cpu"))
    expected_slots = [int(step.tables[i, p // 16]) * 16 + p % 16
                      for i, (c, q) in enumerate(seqs) for p in range(c - q, c)]
    assert step.slot_mapping.tolist() == expected_slots and len(set(expected_slots)) == len(expected_slots)
    ref_k, _ = step.reference_caches()
    changed = (ref_k != step.k_cache).flatten(2).any(2).flatten().nonzero().flatten().tolist()
    assert set(changed) == set(expected_slots)
    width = step.tables.shape[1]
    assert torch.equal(step.plan.block_tables[:, :width], step.tables) and step.plan.block_tables.shape[1] % 8 == 0
    out = step.expected(*step.reference_caches())
    assert out.shape == step.query.shape and torch.isfinite(out).all()

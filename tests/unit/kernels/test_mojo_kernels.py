"""The Mojo kernels against the torch reference on fresh random inputs every run.

Shapes cover GQA ratios 1/2/4/8, head_dim 64 and 128, block sizes 8/16/32, contexts of 1 token, at
block boundaries -1/0/+1 and beyond 1000, ragged batches mixing decode rows and prefill chunks over
cached prefixes, in float32 and bfloat16. Outputs are poisoned with NaN before each call, so an element
the kernel forgets to write fails. Bad calls must raise before reaching the kernel.
"""

from __future__ import annotations

import random

import pytest
import torch

from kernels import attention as mojo_attention
from kernels.reference import attention as reference
from kernels.reference.paged_inputs import random_paged_batch
from tests.helpers.paged_attention_checks import assert_kernel_matches_reference


def make_batch(rng: random.Random, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
               seqs: list[tuple[int, int]], num_blocks: int | None = None):
    b = random_paged_batch(rng, seqs, block_size, kv_heads, head_dim, dtype, num_blocks)
    return b.k_cache, b.v_cache, b.plan, b.ref_plan, b.slots


def check_attention(module, rng, block_size, kv_heads, group, head_dim, dtype, seqs):
    k_cache, v_cache, plan, ref_plan, _ = make_batch(rng, block_size, kv_heads, head_dim, dtype, seqs)
    query = torch.randn(plan.num_tokens, kv_heads * group, head_dim).to(dtype)
    # float32: the same math in another order. bfloat16: both accumulate in float32 and round once.
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1.6e-2, rtol=1.6e-2)
    assert_kernel_matches_reference(module, query, k_cache, v_cache, plan, ref_plan, head_dim ** -0.5, **tol)


def boundary_contexts(block_size: int) -> list[int]:
    return [1, block_size - 1, block_size, block_size + 1, 2 * block_size, 1037]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_rows(module, test_seed, dtype, block_size, group, head_dim):
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    seqs = [(c, 1) for c in boundary_contexts(block_size)]
    rng.shuffle(seqs)
    check_attention(module, rng, block_size, 2, group, head_dim, dtype, seqs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_ragged_prefill_with_cached_prefixes_and_decodes(module, test_seed, dtype, block_size, group, head_dim):
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    b = block_size
    seqs = [(b + 1, b + 1),  # a whole prompt, no prefix
            (3 * b, b - 1),  # a chunk after a cached prefix, ending on a block boundary
            (1037, 40),  # a long cached prefix
            (b - 1, 1), (2 * b + 1, 1),  # decodes in the same batch
            (1, 1), (rng.randrange(17, 300), 17)]
    rng.shuffle(seqs)
    check_attention(module, rng, block_size, 2, group, head_dim, dtype, seqs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_other_head_dims_and_odd_groups(module, test_seed, dtype):
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    # (64, 3, 3) and (128, 1, 6) take the compiled head_dim path with passes of 3 and of 4 + 2 heads.
    for head_dim, kv_heads, group in ((8, 1, 3), (72, 3, 3), (256, 1, 2), (96, 4, 1), (64, 3, 3), (128, 1, 6)):
        check_attention(module, rng, 16, kv_heads, group, head_dim, dtype, [(33, 1), (70, 9), (5, 5)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_write_kv_matches_reference(module, test_seed, dtype):
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    k_cache, v_cache, plan, _, slots = make_batch(rng, 16, 3, 64, dtype, [(40, 40), (17, 1), (100, 7)])
    # key contiguous; value a strided view, as the model's fused qkv projection hands it over
    key = torch.randn(plan.num_tokens, 3, 64).to(dtype)
    value = torch.randn(plan.num_tokens, 2, 3, 64).to(dtype)[:, 1]
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    reference.write_kv(k_ref, v_ref, key, value, slots)
    mojo_attention.write_kv(module, k_cache, v_cache, key, value, plan)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_bad_calls_raise_before_the_kernel(module, test_seed):
    rng = random.Random(test_seed)
    k_cache, v_cache, plan, _, slots = make_batch(rng, 16, 2, 64, torch.float32, [(20, 4)], num_blocks=4)
    query = torch.randn(4, 4, 64)
    bad = [
        lambda: mojo_attention.paged_attention(module, query.bfloat16(), k_cache, v_cache, plan, 1.0),  # dtype mix
        lambda: mojo_attention.paged_attention(module, query[:3], k_cache, v_cache, plan, 1.0),  # token count
        lambda: mojo_attention.paged_attention(module, torch.randn(4, 3, 64), k_cache, v_cache, plan, 1.0),  # groups
        lambda: mojo_attention.paged_attention(module, query.transpose(0, 1).contiguous().transpose(0, 1), k_cache,
                                         v_cache, plan, 1.0),  # heads not contiguous
        lambda: mojo_attention.paged_attention(module, query, k_cache.transpose(1, 2), v_cache.transpose(1, 2), plan,
                                         1.0),  # cache not contiguous
        lambda: mojo_attention.paged_attention(module, query, k_cache[:plan.max_block_id], v_cache[:plan.max_block_id],
                                         plan, 1.0),  # the highest block id lies beyond the cache
        lambda: mojo_attention.write_kv(module, k_cache[:plan.max_slot // 16], v_cache[:plan.max_slot // 16],
                                  torch.randn(4, 2, 64), torch.randn(4, 2, 64), plan),  # a slot beyond the cache
        lambda: mojo_attention.write_kv(module, k_cache, v_cache, torch.randn(4, 2, 32), torch.randn(4, 2, 32), plan),
        lambda: mojo_attention.StepPlan.build(plan.block_tables[:, :1], (20,), (4,), slots, 16),  # table too narrow
        lambda: mojo_attention.StepPlan.build(plan.block_tables, (20,), (21,), slots, 16),  # query beyond context
        lambda: mojo_attention.paged_attention(module, torch.randn(4, 4, 60), *(torch.randn(4, 16, 2, 60),) * 2,
                                         plan, 1.0),  # head_dim not a multiple of 8
    ]
    for i, call in enumerate(bad):
        with pytest.raises(ValueError, match="mojo attention"):
            call()
            pytest.fail(f"bad call {i} did not raise")


def test_auto_falls_back_to_torch_loudly_when_the_kernels_cannot_load(monkeypatch, caplog):
    from worker.attention.selection import get_attention_backend

    assert get_attention_backend("auto").name == "mojo"  # built by `make test`

    def broken():
        raise OSError("libKGENCompilerRTShared.so: cannot open shared object file")

    monkeypatch.setattr(mojo_attention, "load_module", broken)
    assert get_attention_backend("auto").name == "torch"
    assert "falling back to the torch reference" in caplog.text and "cannot open" in caplog.text
    with pytest.raises(RuntimeError, match="mojo attention backend is unavailable"):
        get_attention_backend("mojo")


def test_openmp_bridge_shares_torchs_runtime_and_has_a_fallback(module, test_seed, monkeypatch):
    """Where a C compiler exists the bridge builds and finds exactly one OpenMP runtime (torch's), so the
    engine's "omp" calls really run on torch's team; without it they run on the calling thread, same result."""
    import shutil

    if shutil.which("cc") or shutil.which("gcc"):
        assert mojo_attention.omp_team() is not None
    rng = random.Random(test_seed)
    k_cache, v_cache, plan, ref_plan, _ = make_batch(rng, 16, 3, 64, torch.bfloat16, [(200, 1), (37, 1), (16, 1)])
    query = torch.randn(plan.num_tokens, 9, 64).to(torch.bfloat16)
    on_team = mojo_attention.paged_attention(module, query, k_cache, v_cache, plan, 0.125, threading="omp")
    monkeypatch.setattr(mojo_attention, "omp_team", lambda: None)
    fallback = mojo_attention.paged_attention(module, query, k_cache, v_cache, plan, 0.125, threading="omp")
    torch.testing.assert_close(fallback, on_team, rtol=0, atol=0)  # items are independent: bit-identical


def _paged_copy(rng: random.Random, keys: torch.Tensor, values: torch.Tensor, block_size: int):
    """keys/values [ctx, kv_heads, head_dim] scattered over a paged cache of block_size in a random page order,
    with spare pages of noise: (k_cache, v_cache, block table row)."""
    ctx = keys.shape[0]
    needed = -(-ctx // block_size)
    pages = list(range(needed + 3))
    rng.shuffle(pages)
    k_cache = torch.randn(needed + 3, block_size, *keys.shape[1:]).to(keys.dtype)
    v_cache = torch.randn_like(k_cache)
    for p in range(ctx):
        k_cache[pages[p // block_size], p % block_size] = keys[p]
        v_cache[pages[p // block_size], p % block_size] = values[p]
    return k_cache, v_cache, pages[:needed]


@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                               (torch.float32, torch.float16)], ids=["f32", "bf16", "f32-f16cache"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_a_rows_bits_depend_on_neither_block_size_nor_batch(module, test_seed, dtype, cache_dtype, head_dim):
    """The same keys and query give the same bits in caches of every block size, alone or beside other sequences
    (the engine's batch invariance and its exact recompute after preemption rest on it)."""
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    kv_heads, group, ctx = 2, 3, rng.randrange(300, 700)  # more than one 256-key chunk
    keys = torch.randn(ctx, kv_heads, head_dim).to(cache_dtype)
    values = torch.randn(ctx, kv_heads, head_dim).to(cache_dtype)
    query = torch.randn(1, kv_heads * group, head_dim).to(dtype)
    outs = []
    for block_size in (8, 16, 32):
        k_cache, v_cache, table = _paged_copy(rng, keys, values, block_size)
        for others in (0, 3):  # alone, then third in a batch of decodes over the spare pages
            rows = [([rng.choice(range(len(table) + 3))], rng.randrange(1, block_size + 1), 1) for _ in range(others)]
            rows.insert(min(2, others), (table, ctx, 1))
            width = max(len(t) for t, _, _ in rows)
            tables = torch.tensor([t + [0] * (width - len(t)) for t, _, _ in rows], dtype=torch.int32)
            slots = torch.tensor([t[(c - 1) // block_size] * block_size + (c - 1) % block_size for t, c, _ in rows])
            plan = mojo_attention.StepPlan.build(tables, tuple(c for _, c, _ in rows), (1,) * len(rows), slots,
                                                 block_size)
            batch_query = torch.randn(len(rows), kv_heads * group, head_dim).to(dtype)
            batch_query[min(2, others)] = query[0]
            out = mojo_attention.paged_attention(module, batch_query, k_cache, v_cache, plan, head_dim ** -0.5,
                                                 threading="omp")
            outs.append(out[min(2, others)])
    for out in outs[1:]:
        assert torch.equal(out, outs[0])


@pytest.mark.parametrize("head_dim", [64, 128])
def test_prompt_rows_together_over_a_bfloat16_cache_give_each_row_its_own_bits(module, test_seed, head_dim):
    """A prompt's rows over a bfloat16 cache run together (attention_prompt_bf16.mojo: a chunk's V rows widened
    once for all of them) with exactly the bits each row gets on its own, whatever its chunk edges and neighbours:
    chunking or batching a prompt never changes them, and a decode row after it reads the same cache alike."""
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    for group, kv_heads in ((1, 2), (2, 1), (3, 3), (4, 1), (5, 2), (8, 1)):
        seqs = [(rng.randrange(8, 40), 8), (rng.randrange(300, 700), rng.randrange(9, 60)), (16, 16), (600, 1),
                (rng.randrange(250, 270), 33), (3, 2)]  # prompt chunks over cached prefixes (chunk edges at 256)
        k_cache, v_cache, plan, ref_plan, _ = make_batch(rng, 16, kv_heads, head_dim, torch.bfloat16, seqs)
        query = torch.randn(plan.num_tokens, kv_heads * group, head_dim).to(torch.bfloat16)
        for threading in mojo_attention.THREADINGS:
            together, alone = (mojo_attention.paged_attention(module, query, k_cache, v_cache, plan, 0.125,
                                                              threading=threading, prompt_rows=rows)
                               for rows in (True, False))
            assert torch.equal(together, alone), (group, kv_heads, threading)
        expected = reference.paged_attention(query, k_cache, v_cache, ref_plan, 0.125)
        torch.testing.assert_close(together.float(), expected.float(), atol=1.6e-2, rtol=1.6e-2)


def test_prefill_chunks_go_to_the_kernel_unless_sdpa_is_faster_there(monkeypatch):
    from kernels.builder import target
    from worker.attention import mojo_cpu

    assert mojo_cpu.MojoAttentionBackend(prefill="sdpa").describe() == "mojo (prefill chunks: SDPA)"
    assert mojo_cpu.MojoAttentionBackend(prefill="kernel").describe() == "mojo (prefill chunks: the kernel)"
    with pytest.raises(ValueError, match="prefill must be one of"):
        mojo_cpu.MojoAttentionBackend(prefill="gemm")
    monkeypatch.setattr(target, "cpu_flags", lambda *_: frozenset({"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}))
    assert mojo_cpu.default_prefill() == "sdpa"
    assert mojo_cpu.default_prefill(torch.bfloat16) == "sdpa"
    monkeypatch.setattr(target, "cpu_flags", lambda *_: frozenset({"avx512f", "avx512_bf16", "avx512_vnni"}))
    assert mojo_cpu.default_prefill() == "kernel"
    assert mojo_cpu.default_prefill(torch.bfloat16) == mojo_cpu.default_prefill(torch.int8) == "kernel"
    assert mojo_cpu.default_prefill(torch.float32) == mojo_cpu.default_prefill(torch.float16) == "sdpa"
    monkeypatch.setattr(target, "cpu_flags", lambda *_: frozenset({"avx2", "fma"}))
    assert mojo_cpu.default_prefill(torch.float32) == "sdpa"
    assert mojo_cpu.default_prefill(torch.int8) == "sdpa"  # an int8 cache's prompt rows would go one at a time
    assert mojo_cpu.MojoAttentionBackend(kv_dtype=torch.float32).prefill == "sdpa"


@pytest.mark.parametrize("threads", [2, 3, 4, 8])
def test_work_items_are_ordered_so_equal_count_shares_cost_alike(test_seed, threads, monkeypatch):
    """A prompt's causal rows cost in proportion to their position: the items' equal-count shares (the OpenMP
    split) must each get about the same number of query-key pairs, and every item must appear exactly once."""
    rng = random.Random(test_seed)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    q_lens = [rng.randrange(400, 2100), 1, rng.randrange(1, 40), 1]
    ctx = [q_lens[0], rng.randrange(1, 3000), q_lens[2] + rng.randrange(0, 500), rng.randrange(1, 3000)]
    width = max(-(-c // 16) for c in ctx)
    plan = mojo_attention.StepPlan.build(torch.zeros(len(ctx), width, dtype=torch.int32), tuple(ctx), tuple(q_lens),
                                         torch.arange(sum(q_lens), dtype=torch.int64), 16)
    items = plan.items(kv_heads=2).numpy()
    expected = sorted((s, h, r0, r1) for s, r0, r1 in plan.rows for h in range(2))
    assert sorted(map(tuple, items.tolist())) == expected
    starts = plan.query_start.numpy()

    def cost(item):
        s, _, r0, r1 = item
        first = ctx[s] - (starts[s + 1] - starts[s]) + 1
        return sum(first + r + mojo_attention.ROW_COST_IN_KEYS for r in range(r0, r1))

    n = len(items)
    shares = [sum(cost(it) for it in items[n * t // threads:n * (t + 1) // threads]) for t in range(threads)]
    assert max(shares) <= 1.15 * min(shares), shares
    # The first order (rows in order, heads inside) is what the balancing replaced: there the share holding the
    # prompt's first rows cost far less than the one holding its latest rows.
    naive = [cost((s, h, r0, r1)) for s, r0, r1 in plan.rows for h in range(2)]
    naive_shares = [sum(naive[n * t // threads:n * (t + 1) // threads]) for t in range(threads)]
    assert max(naive_shares) > 1.5 * min(naive_shares), naive_shares


def test_an_unbalanced_plans_item_prefixes_are_its_first_rows(monkeypatch):
    """The decode program refills one plan for its max rows and runs the first rows x kv_heads items each step."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    rows = 40
    plan = mojo_attention.StepPlan.build(torch.zeros(rows, 4, dtype=torch.int32), tuple(range(1, rows + 1)),
                                         (1,) * rows, torch.arange(rows, dtype=torch.int64), 16, balanced=False)
    items = plan.items(kv_heads=3).tolist()
    assert items == [[s, h, 0, 1] for s in range(rows) for h in range(3)]


def test_only_a_plan_with_several_rows_in_an_item_takes_the_prompt_rows_scratch():
    """Decode rows alone get the row path's scratch: the prompt-row paths' room, untouched, would be faulted in
    page by page wherever a thread's share begins (3-8% of a 32 x 1024 decode call, measured)."""
    tables = torch.zeros(3, 4, dtype=torch.int32)
    decode = mojo_attention.StepPlan.build(tables, (5, 9, 20), (1, 1, 1), torch.arange(3, dtype=torch.int64), 16)
    prompt = mojo_attention.StepPlan.build(tables, (5, 9, 20), (1, 2, 1), torch.arange(4, dtype=torch.int64), 16)
    assert not decode.multi_row_items and prompt.multi_row_items

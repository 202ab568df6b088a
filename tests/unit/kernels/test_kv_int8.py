"""The int8 KV cache: its quantization rule (kernels/kv_int8.py), the Mojo writes against it bit for bit,
the Mojo attention over int8 pages against the torch reference over the same pages, and the error
against a bfloat16 cache within a stated bound."""

from __future__ import annotations

import random

import pytest
import torch

from kernels import attention as mojo_attention
from kernels import kv_int8
from kernels import layers as mojo_layers
from kernels.reference import attention as reference
from kernels.reference.paged_inputs import random_paged_batch
from tests.helpers.paged_attention_checks import assert_kernel_matches_reference
from worker.model.rotary import RotaryEmbedding


def test_rows_round_trip_within_half_a_step(test_seed):
    g = torch.Generator().manual_seed(test_seed)
    x = torch.randn(50, 3, 64, generator=g) * torch.rand(50, 3, 1, generator=g) * 10
    x[7, 1] = 0  # a zero row: scale 0, values 0
    x[9, 2, 5] = 1e4  # an outlier sets its row's scale
    q, scale = kv_int8.quantize_rows(x)
    assert q.dtype == torch.int8 and q.shape == (50, 3, 64) and scale.shape == (50, 3)
    assert torch.equal(scale, x.abs().amax(-1) / 127)
    assert q.abs().max() <= 127 and (q.abs().amax(-1) == 127)[scale > 0].all()
    # A cache of those rows (50 tokens in blocks of 10) gives them back within half a step.
    cache = kv_int8.to_cache(x.view(5, 10, 3, 64))
    assert cache.dtype == torch.int8 and cache.shape == (5, 10, 3, 64 + kv_int8.SCALE_BYTES)
    err = (kv_int8.dequantize(cache).view(50, 3, 64) - x).abs()
    # Round to nearest: at most half a step, plus float32's own rounding of x * 127 / max and of q * scale (up to
    # an ulp of x: a bound of half a step times 1 + 1e-6 failed for about one seed in 30).
    assert (err <= scale.unsqueeze(-1) / 2 + x.abs() * 2 ** -22).all()
    assert torch.equal(kv_int8.dequantize(cache).view(50, 3, 64)[7, 1], torch.zeros(64))
    assert kv_int8.head_dim_of(cache) == 64 and kv_int8.row_width(64, torch.int8) == 68


def test_a_blocks_values_come_before_its_scales(test_seed):
    """The layout the kernels read: in each block, row (t, h)'s values at bytes (t * kv_heads + h) * head_dim,
    then every row's float32 scale in the same order."""
    g = torch.Generator().manual_seed(test_seed)
    x = torch.randn(4, 16, 3, 64, generator=g)
    cache = kv_int8.to_cache(x)
    q, scale = kv_int8.quantize_rows(x)
    block = cache.view(4, -1)[2]
    assert torch.equal(block[:16 * 3 * 64].view(16, 3, 64), q[2])
    assert torch.equal(block[16 * 3 * 64:].view(torch.float32).view(16, 3), scale[2])
    # write() puts a token's rows where to_cache does.
    written = torch.zeros_like(cache)
    kv_int8.write(written, torch.arange(64), x.view(64, 3, 64))
    assert torch.equal(written, cache)


def int8_batch(rng: random.Random, block_size, kv_heads, head_dim, dtype, seqs):
    """A random paged batch whose caches are the int8 rows of its random float caches."""
    b = random_paged_batch(rng, seqs, block_size, kv_heads, head_dim, dtype)
    return b, kv_int8.to_cache(b.k_cache), kv_int8.to_cache(b.v_cache)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_write_kv_quantizes_as_the_reference_bit_for_bit(module, test_seed, dtype):
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    b, k_cache, v_cache = int8_batch(rng, 16, 3, 64, dtype, [(40, 40), (17, 1), (100, 7)])
    key = (torch.randn(b.plan.num_tokens, 3, 64) * 4).to(dtype)
    key[2, 1] = 0  # a zero row
    value = torch.randn(b.plan.num_tokens, 2, 3, 64).to(dtype)[:, 1]  # strided, as the fused qkv hands it over
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    reference.write_kv(k_ref, v_ref, key, value, b.slots)
    mojo_attention.write_kv(module, k_cache, v_cache, key, value, b.plan)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("head_dim,qk_norm", [(64, False), (128, True)])
def test_rope_write_kv_stores_the_int8_rows_of_what_a_float_cache_holds(layers_module, test_seed, dtype, head_dim,
                                                                       qk_norm):
    g = torch.Generator().manual_seed(test_seed)
    heads, kv_heads, tokens, block_size, num_blocks, max_pos = 6, 2, 9, 4, 12, 200
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    positions = torch.randint(0, max_pos, (tokens,), generator=g)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens]
    rotary = RotaryEmbedding(head_dim, max_pos, 10000.0, None)
    norms = [(torch.rand(head_dim, generator=g) + 0.5).to(dtype) for _ in range(2)] if qk_norm else [None, None]
    tables = torch.arange(num_blocks, dtype=torch.int32).reshape(1, -1)
    plan = mojo_attention.StepPlan.build(tables, (num_blocks * block_size,), (tokens,), slots, block_size)

    def run(cache_dtype):
        row = kv_int8.row_width(head_dim, cache_dtype)
        k_cache = torch.zeros(num_blocks, block_size, kv_heads, row, dtype=cache_dtype)
        v_cache = torch.zeros_like(k_cache)
        q = mojo_layers.rope_write_kv(layers_module, qkv, positions, rotary.cos, rotary.sin_signed, k_cache, v_cache,
                                      plan, heads, *norms, 1e-6)
        return q, k_cache, v_cache

    q_float, k_float, v_float = run(dtype)
    q_int8, k_int8, v_int8 = run(torch.int8)
    assert torch.equal(q_int8, q_float)
    assert torch.equal(k_int8, kv_int8.to_cache(k_float)) and torch.equal(v_int8, kv_int8.to_cache(v_float))


def check_against_reference(module, rng, block_size, kv_heads, group, head_dim, dtype, seqs):
    b, k_cache, v_cache = int8_batch(rng, block_size, kv_heads, head_dim, dtype, seqs)
    query = torch.randn(b.plan.num_tokens, kv_heads * group, head_dim).to(dtype)
    # Both dequantize the same int8 rows and attend in float32: only the order of the sums differs
    # (and, in bfloat16, the output's one rounding).
    tol = dict(atol=2e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=1.6e-2, rtol=1.6e-2)
    assert_kernel_matches_reference(module, query, k_cache, v_cache, b.plan, b.ref_plan, head_dim ** -0.5, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 6])  # every head count a pass takes (1-4 at head_dim 64, 1-2 at 128)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_attention_over_int8_pages_matches_the_reference(module, test_seed, dtype, block_size, group, head_dim):
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    b = block_size
    seqs = [(1, 1), (b - 1, 1), (b, 1), (b + 1, 1), (2 * b, 1), (1037, 1),  # decode rows at block boundaries
            (3 * b, b - 1), (b + 1, b + 1), (rng.randrange(17, 300), 17)]  # prefill chunks over cached prefixes
    rng.shuffle(seqs)
    check_against_reference(module, rng, block_size, 2, group, head_dim, dtype, seqs)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_bfloat16_rows_over_int8_pages_are_one_rounding_from_the_reference(module, test_seed, head_dim):
    """With bfloat16 queries (what the engine runs) the V pass sums int8 values against 16-bit weights in
    integers (attention_parts.add_values_i16, on CPUs with AVX512-VNNI): each output stays within one bfloat16
    rounding (half a unit in the last place, at most 2^-8 of the value) of the float32 reference over the same
    int8 rows, give or take 1e-3 of the output's scale. Covers decode rows and prompt rows, chunks of odd length
    (the walk takes keys in pairs), contexts across the 256-key chunk edge and every head count of a pass."""
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    scale = head_dim ** -0.5
    for group, kv_heads in ((1, 2), (2, 1), (3, 3), (4, 1), (6, 1)):
        seqs = [(1, 1), (rng.randrange(2, 40) * 2 + 1, 1), (257, 1), (rng.randrange(300, 1100), 1),
                (rng.randrange(250, 270), rng.randrange(17, 40)), (33, 33)]
        b, k_cache, v_cache = int8_batch(rng, 16, kv_heads, head_dim, torch.bfloat16, seqs)
        query = (torch.randn(b.plan.num_tokens, kv_heads * group, head_dim) * 2).to(torch.bfloat16)
        exact = reference.paged_attention(query.float(), kv_int8.dequantize(k_cache).view(b.k_cache.shape),
                                          kv_int8.dequantize(v_cache).view(b.v_cache.shape), b.ref_plan, scale)
        out = mojo_attention.paged_attention(module, query, k_cache, v_cache, b.plan, scale).float()
        excess = (out - exact).abs() - exact.abs() * 2 ** -8
        assert excess.max() <= 1e-3 * exact.abs().max(), (group, kv_heads)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_prompt_rows_together_give_each_row_its_own_bits(module, test_seed, head_dim):
    """A prompt's rows over an int8 cache run together (attention_prompt.mojo: a chunk's keys scored for 16 rows
    at once) with exactly the bits each row gets on its own: chunking or batching a prompt never changes them."""
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    for group, kv_heads in ((1, 2), (2, 1), (3, 3), (4, 1), (5, 2), (8, 1)):
        seqs = [(rng.randrange(8, 40), 8), (rng.randrange(300, 700), rng.randrange(9, 60)), (16, 16), (600, 1),
                (rng.randrange(250, 270), 33)]  # prompt chunks over cached prefixes (chunk edges at 256), a decode
        b, k_cache, v_cache = int8_batch(rng, 16, kv_heads, head_dim, torch.bfloat16, seqs)
        query = torch.randn(b.plan.num_tokens, kv_heads * group, head_dim).to(torch.bfloat16)
        for threading in mojo_attention.THREADINGS:
            together, alone = (mojo_attention.paged_attention(module, query, k_cache, v_cache, b.plan, 0.125,
                                                              threading=threading, prompt_rows=rows)
                               for rows in (True, False))
            assert torch.equal(together, alone), (group, kv_heads, threading)


def test_the_scratch_has_room_for_the_prompt_rows(module):
    """The prompt-row paths (int8 and bfloat16 caches) run only where an item's scratch holds their part:
    kernels/attention.py's figure is the kernel's own, the larger of the two."""
    assert mojo_attention._PROMPT_ROWS_FLOATS == module.prompt_rows_scratch(())


def test_other_head_dims_take_the_generic_path(module, test_seed):
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    for head_dim, kv_heads, group in ((8, 1, 3), (72, 3, 3), (96, 4, 1), (256, 1, 2)):
        check_against_reference(module, rng, 16, kv_heads, group, head_dim, torch.bfloat16, [(33, 1), (70, 9)])


def test_error_against_a_bfloat16_cache_is_bounded(module, test_seed):
    """The stated bound: attention over int8 pages differs from attention over the bfloat16 pages they
    came from by at most 2% of the output's scale (max |out|), here on random keys and values."""
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    b = random_paged_batch(rng, [(c, 1) for c in (5, 64, 300, 1500)], 16, 2, 64, torch.bfloat16)
    query = (torch.randn(b.plan.num_tokens, 8, 64) * 2).to(torch.bfloat16)
    exact = reference.paged_attention(query.float(), b.k_cache.float(), b.v_cache.float(), b.ref_plan, 0.125)
    int8 = mojo_attention.paged_attention(module, query, kv_int8.to_cache(b.k_cache), kv_int8.to_cache(b.v_cache),
                                          b.plan, 0.125)
    bf16 = mojo_attention.paged_attention(module, query, b.k_cache, b.v_cache, b.plan, 0.125)
    bound = 0.02 * exact.abs().amax()
    assert (int8.float() - exact).abs().max() <= bound
    assert (bf16.float() - exact).abs().max() <= bound


def test_bad_int8_calls_raise_before_the_kernel(module, test_seed):
    rng = random.Random(test_seed)
    b, k_cache, v_cache = int8_batch(rng, 16, 2, 64, torch.float32, [(20, 4)])
    query = torch.randn(4, 4, 64)
    bad = [
        lambda: mojo_attention.paged_attention(module, query.half(), k_cache, v_cache, b.plan, 1.0),  # float16 query
        lambda: mojo_attention.paged_attention(module, query, k_cache[..., :64], v_cache[..., :64], b.plan,
                                               1.0),  # rows without their scale: head_dim 60
        lambda: mojo_attention.paged_attention(module, query, k_cache, v_cache.float(), b.plan, 1.0),  # dtypes mix
        lambda: mojo_attention.write_kv(module, k_cache, v_cache, query[:, :2].half(), query[:, :2].half(), b.plan),
        lambda: mojo_attention.write_kv(module, k_cache, v_cache, query[:, :2], query[:, :2].bfloat16(), b.plan),
    ]
    for i, call in enumerate(bad):
        with pytest.raises(ValueError, match="mojo attention"):
            call()
            pytest.fail(f"bad call {i} did not raise")

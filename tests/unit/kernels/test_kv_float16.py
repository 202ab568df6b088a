"""The float16 KV cache beside float32 activations (--kv-cache-dtype float16, for CPUs without bfloat16
arithmetic): the Mojo writes against the reference's rule bit for bit (round to nearest-even, clamped to float16's
finite range), the Mojo attention over float16 pages against the torch reference over the same pages, and the error
against a float32 cache within a stated bound."""

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

F16 = torch.float16


def float16_batch(rng: random.Random, block_size, kv_heads, head_dim, seqs):
    """A random paged batch whose caches hold its random float32 rows in float16."""
    b = random_paged_batch(rng, seqs, block_size, kv_heads, head_dim, torch.float32)
    return b, b.k_cache.to(F16), b.v_cache.to(F16)


def test_the_rule_rounds_to_nearest_and_clamps_to_the_finite_range():
    x = torch.tensor([1.0, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 7e4, -1e9, 65504.0, 65519.0, 3e-8])
    assert kv_int8.to_float_cache(x, F16).tolist() == [1.0, 1.0, 1 + 2 ** -9, 65504.0, -65504.0, 65504.0, 65504.0,
                                                       2 ** -24]
    assert kv_int8.cache_kind(torch.empty(1, dtype=F16)) == 2 and kv_int8.row_width(64, F16) == 64


def test_write_kv_narrows_as_the_reference_bit_for_bit(module, test_seed):
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    b, k_cache, v_cache = float16_batch(rng, 16, 3, 64, [(40, 40), (17, 1), (100, 7)])
    key = torch.randn(b.plan.num_tokens, 3, 64) * 4
    key[2, 1, :3] = torch.tensor([1e5, -7e4, 65519.0])  # beyond float16's range: clamped, never inf
    value = torch.randn(b.plan.num_tokens, 2, 3, 64)[:, 1]  # strided, as the fused qkv hands it over
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    reference.write_kv(k_ref, v_ref, key, value, b.slots)
    mojo_attention.write_kv(module, k_cache, v_cache, key, value, b.plan)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    assert k_cache.isfinite().all() and k_cache.abs().max() == 65504


@pytest.mark.parametrize("head_dim,qk_norm", [(64, False), (128, True)])
def test_rope_write_kv_stores_the_float16_rows_of_what_a_float32_cache_holds(layers_module, test_seed, head_dim,
                                                                             qk_norm):
    g = torch.Generator().manual_seed(test_seed)
    heads, kv_heads, tokens, block_size, num_blocks, max_pos = 6, 2, 9, 4, 12, 200
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g) * 3
    positions = torch.randint(0, max_pos, (tokens,), generator=g)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens]
    rotary = RotaryEmbedding(head_dim, max_pos, 10000.0, None)
    norms = [torch.rand(head_dim, generator=g) + 0.5 for _ in range(2)] if qk_norm else [None, None]
    tables = torch.arange(num_blocks, dtype=torch.int32).reshape(1, -1)
    plan = mojo_attention.StepPlan.build(tables, (num_blocks * block_size,), (tokens,), slots, block_size)

    def run(cache_dtype):
        k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=cache_dtype)
        v_cache = torch.zeros_like(k_cache)
        q = mojo_layers.rope_write_kv(layers_module, qkv, positions, rotary.cos, rotary.sin_signed, k_cache, v_cache,
                                      plan, heads, *norms, 1e-6)
        return q, k_cache, v_cache

    q_float, k_float, v_float = run(torch.float32)
    q_half, k_half, v_half = run(F16)
    assert torch.equal(q_half, q_float)
    assert torch.equal(k_half, kv_int8.to_float_cache(k_float, F16))
    assert torch.equal(v_half, kv_int8.to_float_cache(v_float, F16))


def check_against_reference(module, rng, block_size, kv_heads, group, head_dim, seqs):
    b, k_cache, v_cache = float16_batch(rng, block_size, kv_heads, head_dim, seqs)
    query = torch.randn(b.plan.num_tokens, kv_heads * group, head_dim)
    # Both widen the same float16 rows and attend in float32: only the order of the sums differs.
    assert_kernel_matches_reference(module, query, k_cache, v_cache, b.plan, b.ref_plan, head_dim ** -0.5, atol=2e-5,
                                    rtol=1e-4)


@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 6])  # every head count a pass takes (1-4 at head_dim 64, 1-2 at 128)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_attention_over_float16_pages_matches_the_reference(module, test_seed, block_size, group, head_dim):
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    b = block_size
    seqs = [(1, 1), (b - 1, 1), (b + 1, 1), (1037, 1),  # decode rows at block edges and past a 256-key chunk
            (b + 1, b + 1), (3 * b, b - 1), (rng.randrange(257, 600), 17)]  # prompt chunks over cached prefixes
    rng.shuffle(seqs)
    check_against_reference(module, rng, block_size, 2, group, head_dim, seqs)


def test_other_head_dims_take_the_generic_path(module, test_seed):
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    for head_dim, kv_heads, group in ((8, 1, 3), (72, 3, 3), (96, 4, 1), (256, 1, 2)):
        check_against_reference(module, rng, 16, kv_heads, group, head_dim, [(33, 1), (70, 9)])


def test_error_against_a_float32_cache_is_bounded(module, test_seed):
    """The stated bound: attention over float16 pages differs from attention over the float32 pages they came from
    by at most 0.2% of the output's scale (max |out|), here on random keys and values (float16 keeps 11 bits)."""
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    b = random_paged_batch(rng, [(c, 1) for c in (5, 64, 300, 1500)], 16, 2, 128, torch.float32)
    query = torch.randn(b.plan.num_tokens, 8, 128) * 2
    exact = mojo_attention.paged_attention(module, query, b.k_cache, b.v_cache, b.plan, 128 ** -0.5)
    half = mojo_attention.paged_attention(module, query, b.k_cache.to(F16), b.v_cache.to(F16), b.plan, 128 ** -0.5)
    assert (half - exact).abs().max() <= 0.002 * exact.abs().amax()


def test_bad_float16_calls_raise_before_the_kernel(module, test_seed):
    rng = random.Random(test_seed)
    b, k_cache, v_cache = float16_batch(rng, 16, 2, 64, [(20, 4)])
    query = torch.randn(4, 4, 64)
    bad = [
        lambda: mojo_attention.paged_attention(module, query.bfloat16(), k_cache, v_cache, b.plan, 1.0),
        lambda: mojo_attention.paged_attention(module, query.half(), k_cache, v_cache, b.plan, 1.0),
        lambda: mojo_attention.paged_attention(module, query, k_cache, v_cache.float(), b.plan, 1.0),  # dtypes mix
        lambda: mojo_attention.write_kv(module, k_cache, v_cache, query[:, :2].bfloat16(), query[:, :2].bfloat16(),
                                        b.plan),
        lambda: mojo_attention.write_kv(module, k_cache, v_cache, query[:, :2].half(), query[:, :2].half(), b.plan),
    ]
    for i, call in enumerate(bad):
        with pytest.raises(ValueError, match="mojo attention"):
            call()
            pytest.fail(f"bad call {i} did not raise")

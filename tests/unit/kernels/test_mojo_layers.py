"""The fused layer kernels against the torch modules they replace (which follow transformers' rounding).

float32 agrees to float32 rounding; bfloat16 rounds at the same points as the torch ops, so almost every
element is bit-identical and the rest differ by one bfloat16 step (the kernels sum squares and take
exp in a different order/implementation than torch does).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import attention as mojo_attention
from kernels import layers as mojo_layers
from kernels.reference import attention as reference
from worker.model.layers import RMSNorm
from worker.model.rotary import RotaryEmbedding, apply_rotary

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module")
def module():
    return mojo_layers.load()  # a failed build fails these tests: `make test` builds the kernels


def assert_agrees(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert not actual.isnan().any()
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=2e-6, atol=2e-6)
        return
    a, e = actual.float(), expected.float()
    # Off by at most one bfloat16 step (relative 2^-7), and only rarely.
    torch.testing.assert_close(a, e, rtol=2 ** -7, atol=1e-6)
    assert (a != e).float().mean().item() < 0.01


@pytest.mark.parametrize("threading", mojo_attention.THREADINGS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,dim", [(1, 576), (7, 64), (33, 1024), (130, 200)])
def test_rms_norm_and_residual_add(module, rows, dim, dtype, threading):
    g = torch.Generator().manual_seed(rows * dim)
    x = (torch.randn(rows, dim, generator=g) * 3).to(dtype)
    res = torch.randn(rows, dim, generator=g).to(dtype)
    norm = RMSNorm(dim, 1e-6, dtype=dtype)
    norm.weight.data = (torch.rand(dim, generator=g) + 0.5).to(dtype)
    with torch.inference_mode():
        assert_agrees(mojo_layers.rms_norm(module, x, norm.weight, 1e-6, threading=threading), norm(x))
        summed = res + x  # the torch layer's residual add
        res_in_place = res.clone()
        out = mojo_layers.rms_norm(module, x, norm.weight, 1e-6, residual=res_in_place, threading=threading)
        torch.testing.assert_close(res_in_place, summed, rtol=0, atol=0)  # one rounded add: exact
        assert_agrees(out, norm(summed))


@pytest.mark.parametrize("threading", mojo_attention.THREADINGS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter", [(1, 1536), (5, 8), (64, 200)])
def test_silu_mul(module, rows, inter, dtype, threading):
    g = torch.Generator().manual_seed(rows + inter)
    gate_up = (torch.randn(rows, 2 * inter, generator=g) * 4).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    assert_agrees(mojo_layers.silu_mul(module, gate_up, threading=threading), F.silu(gate) * up)


@pytest.mark.parametrize("threading", mojo_attention.THREADINGS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,qk_norm", [(9, 3, 64, False), (4, 2, 128, True), (2, 2, 16, True)])
def test_rope_write_kv(module, heads, kv_heads, head_dim, qk_norm, dtype, threading):
    g = torch.Generator().manual_seed(heads * head_dim + qk_norm)
    tokens, block_size, num_blocks, max_pos = 11, 4, 40, 300
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype)
    positions = torch.randint(0, max_pos, (tokens,), generator=g)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:tokens]
    rotary = RotaryEmbedding(head_dim, max_pos, 10000.0, None)
    norms = None
    if qk_norm:
        norms = [RMSNorm(head_dim, 1e-6, dtype=dtype) for _ in range(2)]
        for n in norms:
            n.weight.data = (torch.rand(head_dim, generator=g) + 0.5).to(dtype)

    # The torch path, as the decoder's reference layer runs it.
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim), v.view(tokens, kv_heads, head_dim)
    if norms:
        q, k = norms[0](q), norms[1](k)
    cos, sin_signed = rotary.tables(positions, dtype)
    q_ref, k_ref = apply_rotary(q, cos, sin_signed), apply_rotary(k, cos, sin_signed)
    k_cache_ref = torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    v_cache_ref = torch.zeros_like(k_cache_ref)
    reference.write_kv(k_cache_ref, v_cache_ref, k_ref, v, slots)

    k_cache = torch.full_like(k_cache_ref, float("nan"))
    k_cache.view(-1, kv_heads, head_dim)[:] = 0
    v_cache = torch.zeros_like(v_cache_ref)
    tables = torch.arange(num_blocks, dtype=torch.int32).reshape(1, -1)
    plan = mojo_attention.StepPlan.build(tables, (num_blocks * block_size,), (tokens,), slots, block_size)
    mojo_layers.check_positions(positions, max_pos)
    q_out = mojo_layers.rope_write_kv(module, qkv, positions, rotary.cos, rotary.sin_signed, k_cache, v_cache, plan,
                                      heads, norms[0].weight if norms else None, norms[1].weight if norms else None,
                                      1e-6, threading=threading)
    assert_agrees(q_out, q_ref)
    assert_agrees(k_cache, k_cache_ref)
    torch.testing.assert_close(v_cache, v_cache_ref, rtol=0, atol=0)  # V is copied as is


def test_bad_calls_raise_before_the_kernel(module):
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="norm weight"):
        mojo_layers.rms_norm(module, x, torch.ones(32), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        mojo_layers.rms_norm(module, x, torch.ones(64), 1e-6, residual=torch.zeros(3, 64))
    with pytest.raises(ValueError, match="contiguous"):
        mojo_layers.silu_mul(module, torch.randn(64, 4).t())
    with pytest.raises(ValueError, match="rotary tables"):
        mojo_layers.check_positions(torch.tensor([0, 5, 300]), 300)
    k_cache = torch.zeros(4, 4, 1, 16)
    plan = mojo_attention.StepPlan.build(torch.zeros(1, 1, dtype=torch.int32), (2,), (2,), torch.tensor([0, 99]), 4)
    table = torch.zeros(8, 16)
    with pytest.raises(ValueError, match="slot lies outside"):
        mojo_layers.rope_write_kv(module, torch.zeros(2, 48), torch.zeros(2, dtype=torch.int64), table, table,
                                  k_cache, k_cache.clone(), plan, 1, None, None, 1e-6)

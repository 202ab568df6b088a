"""The torch reference attention against a dense, float64, one-sequence-at-a-time computation on random
paged inputs: ragged batches mixing decodes of very different lengths (grouped by length inside) with
prefill chunks over cached prefixes, several GQA ratios and block sizes, float32 and bfloat16 caches."""

from __future__ import annotations

import random

import pytest
import torch

from kernels.reference import attention as reference


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [q_len, heads, d] (the last q_len positions); k, v: [ctx, kv_heads, d]. float64, explicit softmax."""
    q_len, heads, _ = q.shape
    ctx, kv_heads, _ = k.shape
    group = heads // kv_heads
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale  # [heads, q_len, ctx]
    query_pos = torch.arange(ctx - q_len, ctx).view(-1, 1)
    scores.masked_fill_(torch.arange(ctx).view(1, -1) > query_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group, block_size", [(1, 8), (2, 16), (4, 32), (8, 16)])
def test_ragged_batch_matches_dense(test_seed, dtype, group, block_size):
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    kv_heads, head_dim = 2, 64
    heads = kv_heads * group
    # (context_len, query_len): decodes at and around block boundaries, long ones, and prefill chunks
    # with and without a cached prefix.
    shapes = [(1, 1), (block_size - 1, 1), (block_size, 1), (block_size + 1, 1), (1030, 1)]
    shapes += [(rng.randint(2, 600), 1) for _ in range(20)]
    shapes += [(7, 7), (40, 13), (block_size * 3 + 1, block_size), (300, 1 + rng.randrange(100))]
    rng.shuffle(shapes)
    blocks_per_seq = [-(-ctx // block_size) for ctx, _ in shapes]
    num_blocks = sum(blocks_per_seq) + 5
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    free = list(range(num_blocks))
    rng.shuffle(free)  # sequences' pages scattered over the cache
    max_blocks = max(blocks_per_seq)
    tables = []
    for n in blocks_per_seq:
        own, free = free[:n], free[n:]
        tables.append(own + [0] * (max_blocks - n))
    block_tables = torch.tensor(tables, dtype=torch.int32)
    context_lens = [ctx for ctx, _ in shapes]
    query_lens = [q for _, q in shapes]
    query = torch.randn(sum(query_lens), heads, head_dim).to(dtype)
    scale = head_dim ** -0.5

    plan = reference.plan_attention(block_tables, context_lens, query_lens, block_size)
    assert len(plan.decode) > 1, "ragged decode lengths should be split into groups"
    out = reference.paged_attention(query, k_cache, v_cache, plan, scale)

    start = 0
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
    for (ctx, q_len), table in zip(shapes, tables):
        n = -(-ctx // block_size)
        k = k_cache[table[:n]].reshape(-1, kv_heads, head_dim)[:ctx]
        v = v_cache[table[:n]].reshape(-1, kv_heads, head_dim)[:ctx]
        expected = dense_attention(query[start:start + q_len], k, v, scale)
        torch.testing.assert_close(out[start:start + q_len].double(), expected, **tol,
                                   msg=lambda m: f"context {ctx}, query {q_len}: {m}")
        start += q_len


def test_write_kv_scatters_through_the_slot_mapping(test_seed):
    torch.manual_seed(test_seed)
    k_cache = torch.full((6, 4, 2, 8), float("nan"))
    v_cache = torch.full((6, 4, 2, 8), float("nan"))
    slots = torch.tensor([21, 3, 4, 17])
    key, value = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    reference.write_kv(k_cache, v_cache, key, value, slots)
    for i, slot in enumerate(slots.tolist()):
        assert torch.equal(k_cache[slot // 4, slot % 4], key[i])
        assert torch.equal(v_cache[slot // 4, slot % 4], value[i])
    assert int(torch.isnan(k_cache).any(dim=(-1, -2)).sum()) == 24 - 4  # nothing else written


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prompt_gets_the_same_bits_however_it_is_chunked(test_seed, dtype):
    """Chunked prefill cuts a prompt where the step's token budget, prefix-cache hits or preemption put the cut;
    every chunking of a prompt gives each row the same bits, a one-token chunk (a prompt's last token after a
    cache hit) included, when it is planned as a prompt row."""
    rng = random.Random(test_seed)
    torch.manual_seed(test_seed)
    length, heads, kv_heads, head_dim, block_size = 300, 8, 2, 64, 16
    blocks = -(-length // block_size)
    k_cache = torch.randn(blocks + 4, block_size, kv_heads, head_dim).to(dtype)
    v_cache = torch.randn(blocks + 4, block_size, kv_heads, head_dim).to(dtype)
    table = torch.randperm(blocks + 4)[:blocks].to(torch.int32).view(1, -1)
    query = torch.randn(length, heads, head_dim).to(dtype)

    def attend(cuts: list[int]) -> torch.Tensor:
        out = []
        for a, b in zip(cuts, cuts[1:]):
            plan = reference.plan_attention(table, [b], [b - a], block_size, frozenset({0}) if b - a == 1 else frozenset())
            out.append(reference.paged_attention(query[a:b], k_cache, v_cache, plan, head_dim ** -0.5))
        return torch.cat(out)

    whole = attend([0, length])
    chunkings = [[0, 100, length], [0, 64, 200, length], [0, length - 1, length], [0, 1, 2, 3, 250, length]]
    chunkings += [[0, *sorted(rng.sample(range(1, length), 6)), length] for _ in range(4)]
    for cuts in chunkings:
        assert torch.equal(attend(cuts), whole), cuts

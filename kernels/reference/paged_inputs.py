"""Random paged K/V caches with their step plans, for the kernels' tests and benchmarks."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from kernels import attention as mojo_attention
from kernels.reference import attention as reference


@dataclass
class PagedBatch:
    k_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor
    plan: mojo_attention.StepPlan
    ref_plan: reference.AttentionPlan
    slots: torch.Tensor  # [num_tokens] int64: the cache slot of each new token


def random_paged_batch(rng: random.Random, seqs: list[tuple[int, int]], block_size: int, kv_heads: int,
                       head_dim: int, dtype: torch.dtype, num_blocks: int | None = None) -> PagedBatch:
    """seqs: (context_len, query_len) per sequence; every sequence's pages are scattered over the cache
    in random order, as a long-running server leaves them."""
    needed = [-(-c // block_size) for c, _ in seqs]
    num_blocks = num_blocks or sum(needed) + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    pages = list(range(num_blocks))
    rng.shuffle(pages)
    tables = torch.zeros(len(seqs), max(needed), dtype=torch.int32)
    slots = []
    for i, ((ctx, q_len), n) in enumerate(zip(seqs, needed)):
        tables[i, :n] = torch.tensor([pages.pop() for _ in range(n)])
        slots += [int(tables[i, p // block_size]) * block_size + p % block_size for p in range(ctx - q_len, ctx)]
    ctx_lens = tuple(c for c, _ in seqs)
    q_lens = tuple(q for _, q in seqs)
    slot_tensor = torch.tensor(slots)
    return PagedBatch(k_cache, v_cache, mojo_attention.StepPlan.build(tables, ctx_lens, q_lens, slot_tensor, block_size),
                      reference.plan_attention(tables, list(ctx_lens), list(q_lens), block_size), slot_tensor)

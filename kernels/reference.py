"""Torch reference implementations of the attention kernels: the oracle the Mojo kernels are tested against.

Written for obviousness first: float32 math, explicit masks, no fused library calls whose numerics
could hide a bug. Decode rows (one query token) are batched into one padded gather so the reference
stays usable as a serving backend; prefill rows go one sequence at a time, tiled over queries to bound
memory.

Cache layout, per layer: K and V as [num_blocks, block_size, num_kv_heads, head_dim].
"""

from __future__ import annotations

import torch

# Query rows per tile in prefill; bounds the [kv_heads, group, tile, context] score tensor.
_PREFILL_QUERY_TILE = 256


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter the step's new K/V rows into the paged cache. key/value: [num_tokens, kv_heads, head_dim];
    slot_mapping: [num_tokens] int64 flat slot (block * block_size + offset)."""
    num_blocks, block_size, kv_heads, head_dim = k_cache.shape
    k_cache.view(num_blocks * block_size, kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_cache.view(num_blocks * block_size, kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, context_lens: list[int], query_lens: list[int],
                    scale: float) -> torch.Tensor:
    """Causal attention of a ragged batch of query chunks over their paged K/V.

    query: [num_tokens, num_heads, head_dim], sequences' chunks back to back in batch order.
    block_tables: [batch, max_blocks] int32 (padding entries must be valid block ids, e.g. 0).
    context_lens[i]: keys sequence i attends to, its new tokens included (already written to the cache).
    query_lens[i]: new tokens of sequence i; they are the last query_lens[i] of its context.
    Returns [num_tokens, num_heads, head_dim] in query's dtype.
    """
    out = torch.empty_like(query)
    decode_rows = [i for i, n in enumerate(query_lens) if n == 1]
    starts = _exclusive_cumsum(query_lens)
    if decode_rows:
        tokens = torch.tensor([starts[i] for i in decode_rows])
        rows = torch.tensor(decode_rows)
        out[tokens] = _decode(query[tokens], k_cache, v_cache, block_tables[rows],
                              [context_lens[i] for i in decode_rows], scale)
    for i, q_len in enumerate(query_lens):
        if q_len > 1:
            s = starts[i]
            out[s:s + q_len] = _prefill(query[s:s + q_len], k_cache, v_cache, block_tables[i],
                                        context_lens[i], scale)
    return out


def _exclusive_cumsum(values: list[int]) -> list[int]:
    starts, total = [], 0
    for v in values:
        starts.append(total)
        total += v
    return starts


def _gather_kv(cache: torch.Tensor, block_ids: torch.Tensor, length: int) -> torch.Tensor:
    """[..., n_blocks] block ids -> [..., length, kv_heads, head_dim] float32 rows in context order."""
    blocks = cache[block_ids.long()]  # [..., n_blocks, block_size, kv_heads, head_dim]
    lead = blocks.shape[:-4]
    rows = blocks.reshape(*lead, -1, cache.shape[2], cache.shape[3])
    return rows[..., :length, :, :].float()


def _decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
            context_lens: list[int], scale: float) -> torch.Tensor:
    """One query token per sequence. query: [batch, num_heads, head_dim]."""
    batch, num_heads, head_dim = query.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // kv_heads
    max_len = max(context_lens)
    n_blocks = -(-max_len // block_size)
    k = _gather_kv(k_cache, block_tables[:, :n_blocks], max_len)  # [batch, max_len, kv_heads, head_dim]
    v = _gather_kv(v_cache, block_tables[:, :n_blocks], max_len)
    q = query.float().view(batch, kv_heads, group, head_dim)
    scores = torch.einsum("bhgd,blhd->bhgl", q, k) * scale  # [batch, kv_heads, group, max_len]
    lens = torch.tensor(context_lens).view(batch, 1, 1, 1)
    scores.masked_fill_(torch.arange(max_len).view(1, 1, 1, max_len) >= lens, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("bhgl,blhd->bhgd", probs, v)  # [batch, kv_heads, group, head_dim]
    return out.reshape(batch, num_heads, head_dim).to(query.dtype)


def _prefill(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
             context_len: int, scale: float) -> torch.Tensor:
    """A chunk of q_len new tokens at the end of a context_len context. query: [q_len, num_heads, head_dim]."""
    q_len, num_heads, head_dim = query.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // kv_heads
    n_blocks = -(-context_len // block_size)
    k = _gather_kv(k_cache, block_table[:n_blocks], context_len)  # [context_len, kv_heads, head_dim]
    v = _gather_kv(v_cache, block_table[:n_blocks], context_len)
    first_pos = context_len - q_len  # absolute position of the chunk's first token
    key_pos = torch.arange(context_len)
    out = torch.empty_like(query)
    for t0 in range(0, q_len, _PREFILL_QUERY_TILE):
        t1 = min(q_len, t0 + _PREFILL_QUERY_TILE)
        q = query[t0:t1].float().view(t1 - t0, kv_heads, group, head_dim)
        scores = torch.einsum("thgd,lhd->hgtl", q, k) * scale  # [kv_heads, group, tile, context_len]
        query_pos = torch.arange(first_pos + t0, first_pos + t1).view(-1, 1)
        scores.masked_fill_(key_pos.view(1, -1) > query_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        tile = torch.einsum("hgtl,lhd->thgd", probs, v)  # [tile, kv_heads, group, head_dim]
        out[t0:t1] = tile.reshape(t1 - t0, num_heads, head_dim).to(query.dtype)
    return out

"""Torch reference implementations of the attention kernels: the oracle the Mojo kernels are tested against.

Written for obviousness: gather each sequence's pages into contiguous K/V, build the visibility mask
explicitly, and hand both to torch's scaled_dot_product_attention. Decode rows (one query token) are
batched into one padded gather so the reference stays usable as a serving backend; prefill rows go one
sequence at a time.

Cache layout, per layer: K and V as [num_blocks, block_size, num_kv_heads, head_dim].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
    """[..., n_blocks] block ids -> [..., kv_heads, length, head_dim], the layout SDPA takes."""
    num_blocks, block_size, kv_heads, head_dim = cache.shape
    lead = block_ids.shape[:-1]
    # index_select over whole blocks copies contiguous rows; advanced indexing would go element-wise.
    blocks = cache.view(num_blocks, -1).index_select(0, block_ids.reshape(-1))
    rows = blocks.view(*lead, -1, kv_heads, head_dim)[..., :length, :, :]  # [..., length, kv_heads, head_dim]
    return rows.transpose(-3, -2)


def _decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
            context_lens: list[int], scale: float) -> torch.Tensor:
    """One query token per sequence. query: [batch, num_heads, head_dim]."""
    block_size = k_cache.shape[1]
    max_len = max(context_lens)
    n_blocks = -(-max_len // block_size)
    k = _gather_kv(k_cache, block_tables[:, :n_blocks], max_len)  # [batch, kv_heads, max_len, head_dim]
    v = _gather_kv(v_cache, block_tables[:, :n_blocks], max_len)
    lens = torch.tensor(context_lens).view(-1, 1, 1, 1)
    visible = torch.arange(max_len).view(1, 1, 1, max_len) < lens  # [batch, 1, 1, max_len]
    out = _sdpa(query.unsqueeze(2), k, v, visible, scale)  # [batch, num_heads, 1, head_dim]
    return out.squeeze(2)


def _prefill(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
             context_len: int, scale: float) -> torch.Tensor:
    """A chunk of q_len new tokens at the end of a context_len context. query: [q_len, num_heads, head_dim]."""
    q_len = query.shape[0]
    n_blocks = -(-context_len // k_cache.shape[1])
    k = _gather_kv(k_cache, block_table[:n_blocks], context_len)  # [kv_heads, context_len, head_dim]
    v = _gather_kv(v_cache, block_table[:n_blocks], context_len)
    first_pos = context_len - q_len  # absolute position of the chunk's first token
    query_pos = torch.arange(first_pos, context_len).view(-1, 1)
    visible = torch.arange(context_len).view(1, -1) <= query_pos  # [q_len, context_len]: causal over the prefix
    out = _sdpa(query.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), visible, scale)
    return out[0].transpose(0, 1)  # [q_len, num_heads, head_dim]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [b, heads, q_len, d]; k, v: [b, kv_heads, len, d]; visible: bool, broadcast to [b, heads, q_len, len].
    torch's fused CPU kernel accumulates in float32 for bfloat16 inputs, the precision the Mojo kernels
    promise; float32 inputs give float32 math."""
    return F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=visible, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])

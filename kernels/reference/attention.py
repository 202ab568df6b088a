"""Torch reference implementations of the attention kernels: the oracle the Mojo kernels are tested against.

Written for obviousness: gather each sequence's pages into contiguous K/V, build the visibility mask
explicitly, and hand both to torch's scaled_dot_product_attention (whose CPU kernel accumulates in
float32 for bfloat16 inputs, the precision the Mojo kernels promise). Decode rows (one query token)
are batched into one padded gather so the reference stays usable as a serving backend; prefill rows go
one sequence at a time, on the CPU in aligned tiles of query positions so a row's bits do not depend on how its
prompt was chunked (_prefill_tiles).

Everything that depends only on the step's shape (indices, masks) is computed once per step in
`plan_attention` and reused by every layer.

Cache layout, per layer: K and V as [num_blocks, block_size, num_kv_heads, head_dim], or an int8 cache's
[num_blocks, block_size, num_kv_heads, head_dim + 4] bytes per block, its rows' values then their scales
(kernels/kv_int8.py): written by quantizing each new row, read by dequantizing the gathered blocks to float32,
and attended in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels import kv_int8


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter the step's new K/V rows into the paged cache. key/value: [num_tokens, kv_heads, head_dim];
    slot_mapping: [num_tokens] int64 flat slot (block * block_size + offset)."""
    if kv_int8.is_int8(k_cache):
        kv_int8.write(k_cache, slot_mapping, key)
        kv_int8.write(v_cache, slot_mapping, value)
        return
    num_blocks, block_size, kv_heads, row = k_cache.shape
    k_cache.view(num_blocks * block_size, kv_heads, row).index_copy_(0, slot_mapping,
                                                                     kv_int8.to_float_cache(key, k_cache.dtype))
    v_cache.view(num_blocks * block_size, kv_heads, row).index_copy_(0, slot_mapping,
                                                                     kv_int8.to_float_cache(value, v_cache.dtype))


@dataclass(frozen=True)
class PrefillRow:
    start: int  # first token of the chunk in the step
    q_len: int
    context_len: int
    block_ids: torch.Tensor  # [blocks covering context_len] int64
    # [q_len, context_len] bool, causal over the cached prefix and the chunk; None on the CPU, whose tiles
    # (_prefill_tiles) build their own
    visible: torch.Tensor | None


@dataclass(frozen=True)
class DecodeRows:
    tokens: torch.Tensor | None  # [n] int64 token index of each row; None: the rows are the whole step, in order
    max_len: int
    block_ids: torch.Tensor  # [n, blocks covering max_len] int64
    visible: torch.Tensor  # [n, 1, 1, max_len] bool


@dataclass(frozen=True)
class AttentionPlan:
    decode: tuple[DecodeRows, ...]
    prefills: tuple[PrefillRow, ...]


def plan_attention(block_tables: torch.Tensor, context_lens: list[int], query_lens: list[int],
                   block_size: int, single_prompt_rows: frozenset[int] = frozenset()) -> AttentionPlan:
    """block_tables: [batch, max_blocks]; context_lens[i] keys of sequence i (new tokens included);
    query_lens[i] its new tokens, the last query_lens[i] of its context. single_prompt_rows: sequences whose one
    new token is a prompt position, attended as a prompt chunk rather than as a decode row."""
    starts = _exclusive_cumsum(query_lens)
    decode_rows = [i for i, n in enumerate(query_lens) if n == 1 and i not in single_prompt_rows]
    decode = []
    if len(decode_rows) == len(query_lens) and _padding_is_cheap([context_lens[i] for i in decode_rows]):
        decode.append(_decode_rows(None, decode_rows, block_tables, context_lens, block_size))
    else:
        # Decode rows are padded to the longest context of their group; grouping rows of similar
        # length bounds the copied and attended padding when lengths are ragged.
        by_length = sorted(decode_rows, key=lambda i: context_lens[i])
        for group in _length_groups(by_length, [context_lens[i] for i in by_length]):
            tokens = torch.tensor([starts[i] for i in group])
            decode.append(_decode_rows(tokens, group, block_tables, context_lens, block_size))
    prefills = []
    for i, q_len in enumerate(query_lens):
        if q_len > 1 or i in single_prompt_rows:
            ctx = context_lens[i]
            visible = None
            if block_tables.device.type != "cpu":
                visible = torch.arange(ctx).view(1, -1) <= torch.arange(ctx - q_len, ctx).view(-1, 1)
            prefills.append(PrefillRow(starts[i], q_len, ctx, block_tables[i, :_blocks(ctx, block_size)].long(),
                                       visible))
    return AttentionPlan(tuple(decode), tuple(prefills))


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    plan: AttentionPlan, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of a ragged batch of query chunks over their paged K/V.

    query: [num_tokens, num_heads, head_dim], sequences' chunks back to back in batch order; their K/V
    are already in the cache. Returns [num_tokens, num_heads, head_dim] in query's dtype. With `out`,
    only the rows the plan covers are written into it (another kernel may own the others).
    """
    if out is None and len(plan.decode) == 1 and plan.decode[0].tokens is None:
        return _decode(query, k_cache, v_cache, plan.decode[0], scale)  # every row decodes, one group
    out = torch.empty_like(query) if out is None else out
    for group in plan.decode:
        out[group.tokens] = _decode(query[group.tokens], k_cache, v_cache, group, scale)
    for row in plan.prefills:
        chunk = slice(row.start, row.start + row.q_len)
        out[chunk] = _prefill(query[chunk], k_cache, v_cache, row, scale)
    return out


# Grouping costs a few more calls per layer; it pays once padding would be a large share of the work.
_MIN_GROUP_ROWS = 8
_MAX_PADDING_SHARE = 0.25


def _padding_is_cheap(lengths: list[int]) -> bool:
    return sum(lengths) >= (1 - _MAX_PADDING_SHARE) * len(lengths) * max(lengths)


def _length_groups(rows: list[int], lengths: list[int]) -> list[list[int]]:
    """Split rows (sorted by ascending length) into consecutive groups of at least _MIN_GROUP_ROWS,
    closing a group when its padding would exceed _MAX_PADDING_SHARE of its work."""
    groups: list[list[int]] = []
    start = 0
    while start < len(rows):
        end = min(len(rows), start + _MIN_GROUP_ROWS)
        while end < len(rows) and _padding_is_cheap(lengths[start:end + 1]):
            end += 1
        if len(rows) - end < _MIN_GROUP_ROWS:
            end = len(rows)  # too few left for a group of their own
        groups.append(rows[start:end])
        start = end
    return groups


def plan_decode_on_device(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> AttentionPlan:
    """A plan for a step where every sequence decodes one token, built from device tensors alone (no host
    value, so it can be captured in a CUDA graph and replayed with other lengths): every row attends over
    its block table's whole width, and the mask hides the keys past its own context length.

    block_tables: [batch, width] int32, any valid block ids past a row's context; context_lens: [batch]
    int32 on the same device, each in 1..width * block_size."""
    max_len = block_tables.shape[1] * block_size
    visible = torch.arange(max_len, device=context_lens.device).view(1, 1, 1, -1) < context_lens.view(-1, 1, 1, 1)
    return AttentionPlan((DecodeRows(None, max_len, block_tables.long(), visible),), ())


def _decode_rows(tokens: torch.Tensor | None, rows: list[int], block_tables: torch.Tensor,
                 context_lens: list[int], block_size: int) -> DecodeRows:
    lens = [context_lens[i] for i in rows]
    max_len = max(lens)
    tables = block_tables if tokens is None else block_tables[torch.tensor(rows)]
    return DecodeRows(
        tokens=tokens,
        max_len=max_len,
        block_ids=tables[:, :_blocks(max_len, block_size)].long(),
        visible=torch.arange(max_len).view(1, 1, 1, -1) < torch.tensor(lens).view(-1, 1, 1, 1))


def _exclusive_cumsum(values: list[int]) -> list[int]:
    starts, total = [], 0
    for v in values:
        starts.append(total)
        total += v
    return starts


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _gather_kv(cache: torch.Tensor, block_ids: torch.Tensor, length: int) -> torch.Tensor:
    """[..., n_blocks] block ids -> [..., kv_heads, length, head_dim], the layout SDPA takes (float32 from
    an int8 cache)."""
    num_blocks, block_size, kv_heads, row = cache.shape
    lead = block_ids.shape[:-1]
    # index_select over whole blocks copies contiguous rows; advanced indexing would go element-wise.
    blocks = cache.view(num_blocks, -1).index_select(0, block_ids.reshape(-1)).view(-1, block_size, kv_heads, row)
    if kv_int8.is_int8(cache):
        blocks = kv_int8.dequantize(blocks)  # [n_blocks, block_size, kv_heads, head_dim] float32
    rows = blocks.reshape(*lead, -1, kv_heads, blocks.shape[-1])[..., :length, :, :]  # [..., length, kv_heads, d]
    return rows.transpose(-3, -2)


def _decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rows: DecodeRows,
            scale: float) -> torch.Tensor:
    """One query token per sequence. query: [n, num_heads, head_dim] -> same shape."""
    k = _gather_kv(k_cache, rows.block_ids, rows.max_len)  # [n, kv_heads, max_len, head_dim]
    v = _gather_kv(v_cache, rows.block_ids, rows.max_len)
    return _sdpa(query.unsqueeze(2), k, v, rows.visible, scale).squeeze(2)


def _prefill(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, row: PrefillRow,
             scale: float) -> torch.Tensor:
    """One sequence's chunk. query: [q_len, num_heads, head_dim] -> same shape."""
    k = _gather_kv(k_cache, row.block_ids, row.context_len)  # [kv_heads, context_len, head_dim]
    v = _gather_kv(v_cache, row.block_ids, row.context_len)
    if query.device.type == "cpu":
        return _prefill_tiles(query, k, v, row.context_len - row.q_len, scale)
    out = _sdpa(query.transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), row.visible, scale)
    return out[0].transpose(0, 1)


# Query positions per attention call on the CPU, aligned to the sequence's start (a multiple of 16, the blocks).
PREFILL_TILE = 64


def _prefill_tiles(query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int, scale: float) -> torch.Tensor:
    """A chunk's attention, the same bits for each row however its prompt was chunked.

    torch's CPU attention splits its work by the call's query and key counts, so one call per chunk gives a row
    different roundings depending on where the chunk began and ended: that is, on what else the step held (the
    token budget), on prefix-cache hits and on preemption. Here every call covers one tile of PREFILL_TILE query
    positions aligned to the sequence's start and attends keys 0 .. the tile's end: a row's call has the same
    shape and the same visible keys in every chunking (positions of the tile outside the chunk are zero queries,
    and keys past the context zeros that the causal mask hides), so it gets the same bits.

    query: [q_len, num_heads, head_dim], positions first .. first + q_len - 1; k, v: [kv_heads, first + q_len,
    head_dim]. Returns [q_len, num_heads, head_dim] in query's dtype."""
    q_len = query.shape[0]
    end = first + q_len
    tile0 = first - first % PREFILL_TILE
    padded_end = -(-end // PREFILL_TILE) * PREFILL_TILE
    k = F.pad(k, (0, 0, 0, padded_end - end))  # [kv_heads, padded_end, head_dim]
    v = F.pad(v, (0, 0, 0, padded_end - end))
    q = F.pad(query.transpose(0, 1), (0, 0, first - tile0, padded_end - end))  # [heads, padded_end - tile0, d]
    positions = torch.arange(padded_end)
    tiles = []
    for t0 in range(tile0, padded_end, PREFILL_TILE):
        t1 = t0 + PREFILL_TILE
        visible = positions[:t1].view(1, -1) <= positions[t0:t1].view(-1, 1)  # [tile, t1]
        tiles.append(_sdpa(q[:, t0 - tile0:t1 - tile0].unsqueeze(0), k[:, :t1].unsqueeze(0), v[:, :t1].unsqueeze(0),
                           visible, scale)[0])  # [heads, tile, head_dim]
    out = torch.cat(tiles, dim=1)[:, first - tile0:first - tile0 + q_len]  # [heads, q_len, head_dim]
    return out.transpose(0, 1)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [b, heads, q_len, d]; k, v: [b, kv_heads, len, d]; visible: bool, broadcast to [b, heads, q_len, len].
    Computes in the wider of q's and k's dtypes (float32 over a dequantized int8 cache); returns q's dtype."""
    dtype = torch.promote_types(q.dtype, k.dtype)
    out = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), attn_mask=visible, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return out.to(q.dtype)

"""The attention backend interface and the per-step metadata every backend consumes.

The model runner builds one `AttentionMetadata` per step and passes it down through the model as a
value; backends never keep per-step state. The torch backend calls the reference kernels in
`kernels.reference`; any other backend implements the same three methods (plan, write_kv, attend).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from kernels import reference


@dataclass(frozen=True)
class AttentionMetadata:
    """Where this step's tokens go in the paged cache and what each sequence attends to."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: flat cache slot of each new token
    block_tables: torch.Tensor  # [batch, max_blocks] int32, padded with block 0
    context_lens: torch.Tensor  # [batch] int32: keys per sequence, this step's tokens included
    query_start_loc: torch.Tensor  # [batch + 1] int32: offsets of each sequence's tokens in the step
    # Host copies of the lengths: kernels' launch shapes and the reference's loops need them without a sync.
    context_lens_host: tuple[int, ...]
    query_lens_host: tuple[int, ...]
    block_size: int


class AttentionBackend(Protocol):
    """`plan` runs once per step; its result goes to every layer's `write_kv` and `attend`, so work that
    depends only on the step's shape (indices, masks, launch grids) is not repeated per layer."""

    name: str

    def plan(self, meta: AttentionMetadata) -> Any: ...

    def write_kv(self, k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 meta: AttentionMetadata, plan: Any) -> None:
        """key/value: [num_tokens, kv_heads, head_dim] -> cache slots meta.slot_mapping."""

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, plan: Any, scale: float) -> torch.Tensor:
        """query: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim]."""


class TorchAttentionBackend:
    """The reference backend: exact, portable, and the oracle for every other backend."""

    name = "torch"

    def plan(self, meta: AttentionMetadata) -> reference.AttentionPlan:
        return reference.plan_attention(meta.block_tables, list(meta.context_lens_host),
                                        list(meta.query_lens_host), meta.block_size)

    def write_kv(self, k_cache, v_cache, key, value, meta: AttentionMetadata, plan) -> None:
        reference.write_kv(k_cache, v_cache, key, value, meta.slot_mapping)

    def attend(self, query, k_cache, v_cache, meta: AttentionMetadata, plan, scale: float) -> torch.Tensor:
        return reference.paged_attention(query, k_cache, v_cache, plan, scale)


def get_attention_backend(name: str) -> AttentionBackend:
    if name in ("auto", "torch"):
        return TorchAttentionBackend()
    if name == "mojo":
        raise ValueError("the mojo attention backend is not built in this version; use --attention-backend torch")
    raise ValueError(f"unknown attention backend {name!r} (choose auto, mojo or torch)")

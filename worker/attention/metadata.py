"""The per-step attention metadata every backend consumes, and the interface every backend implements.

The model runner builds one `AttentionMetadata` per step and passes it down through the model as a value;
backends never keep per-step state. All backends implement the same three methods (plan, write_kv, attend):
the torch reference (torch_backend.py), the Mojo kernels on the CPU (mojo_cpu.py) and on CUDA (cuda.py);
selection.py picks one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch


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
    # Attention rows whose one new token is a prompt position (a one-token prompt chunk: the prompt's last token
    # after a prefix-cache hit or a token budget's remainder). They attend as a prompt chunk, not as a decode row,
    # so a prompt's bits do not depend on how it was chunked (kernels/reference/attention.py, _prefill_tiles).
    single_prompt_rows: frozenset[int] = frozenset()
    # True for a decode step replayed from a CUDA graph (worker/runner/decode_graphs.py): the host context lengths
    # are then upper bounds (the block tables' width), the step's own lengths live only on the device, and
    # the plan must come from the device tensors alone. Backends that can do that say capturable_decode.
    lengths_are_bounds: bool = False


class AttentionBackend(Protocol):
    """`plan` runs once per step; its result goes to every layer's `write_kv` and `attend`, so work that
    depends only on the step's shape (indices, masks, launch grids) is not repeated per layer."""

    name: str
    capturable_decode: bool  # plans decode steps whose lengths are bounds (meta.lengths_are_bounds)

    def describe(self) -> str:
        """The backend and how it serves, for the start log."""

    def plan(self, meta: AttentionMetadata) -> Any: ...

    def write_kv(self, k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 meta: AttentionMetadata, plan: Any) -> None:
        """key/value: [num_tokens, kv_heads, head_dim] -> cache slots meta.slot_mapping."""

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, plan: Any, scale: float) -> torch.Tensor:
        """query: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim]."""

"""Allocation of the paged KV cache tensors and the choice of their size."""

from __future__ import annotations

import torch

from worker.checkpoint.model_config import ModelConfig


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * element


def num_blocks_for_memory(cfg: ModelConfig, block_size: int, dtype: torch.dtype, memory: int) -> int:
    blocks = memory // bytes_per_block(cfg, block_size, dtype)
    if blocks < 1:
        raise ValueError(f"KV cache memory {memory} bytes holds no block of {block_size} tokens; raise it")
    return blocks


def allocate_kv_caches(cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device | str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (K, V), each [num_blocks, block_size, num_kv_heads, head_dim].

    Zero-filled: attention reads whole blocks and masks the unused tail, and masking multiplies
    values by zero probabilities, which garbage NaNs would survive."""
    shape = (2, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
    caches = []
    for _ in range(cfg.num_layers):
        kv = torch.zeros(shape, dtype=dtype, device=device)
        caches.append((kv[0], kv[1]))
    return caches

"""Allocation of the paged KV cache tensors and the choice of their size."""

from __future__ import annotations

import torch

from kernels import kv_int8
from worker.checkpoint.model_config import ModelConfig


# A float --kv-cache-dtype -> (its dtype, the model dtypes it sits beside, the --dtype that gives one): attention reads
# a bfloat16 cache in the queries' dtype; float16 halves a float32 cache where the CPU has no bfloat16 arithmetic.
_FLOAT_CACHES = {"bfloat16": (torch.bfloat16, (torch.bfloat16,), "bfloat16"),
                 "float16": (torch.float16, (torch.float32, torch.float16), "float32")}


def resolve_kv_dtype(name: str, model_dtype: torch.dtype, dtype_flag: str) -> torch.dtype:
    """--kv-cache-dtype: int8 beside any model dtype (kernels/kv_int8.py); a float cache beside the model dtypes
    _FLOAT_CACHES names; auto the model's dtype, except float16 where --dtype (dtype_flag) auto gave a float32
    model: a CPU without bfloat16 arithmetic, where every other CPU runs bfloat16 with a bfloat16 cache. So every
    CPU gets a 16-bit cache by default, as llama.cpp's default f16 one; an explicit --dtype float32 keeps float32."""
    if name == "auto":
        return torch.float16 if dtype_flag == "auto" and model_dtype == torch.float32 else model_dtype
    if name == "int8":
        return torch.int8
    if name not in _FLOAT_CACHES:
        raise ValueError(f"unknown kv cache dtype {name!r}")
    dtype, beside, model_flag = _FLOAT_CACHES[name]
    if model_dtype in beside:
        return dtype
    raise ValueError(f"kv cache dtype {name} needs a {model_flag} model (this one runs in {model_dtype}); use auto or "
                     f"int8, or --dtype {model_flag}")


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    row = kv_int8.row_width(cfg.head_dim, dtype)  # an int8 row carries its scale
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * row * element


def num_blocks_for_memory(cfg: ModelConfig, block_size: int, dtype: torch.dtype, memory: int) -> int:
    blocks = memory // bytes_per_block(cfg, block_size, dtype)
    if blocks < 1:
        raise ValueError(f"KV cache memory {memory} bytes holds no block of {block_size} tokens; raise it")
    return blocks


def allocate_kv_caches(cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device | str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (K, V), each [num_blocks, block_size, num_kv_heads, head_dim] (head_dim + 4 for int8).

    Zero-filled: attention reads whole blocks and masks the unused tail, and masking multiplies
    values by zero probabilities, which garbage NaNs would survive."""
    shape = (2, num_blocks, block_size, cfg.num_kv_heads, kv_int8.row_width(cfg.head_dim, dtype))
    caches = []
    for _ in range(cfg.num_layers):
        kv = torch.zeros(shape, dtype=dtype, device=device)
        caches.append((kv[0], kv[1]))
    return caches

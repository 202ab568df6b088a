"""Resolving --dtype: bfloat16 where the hardware computes it natively, float32 otherwise."""

from __future__ import annotations

from pathlib import Path

import torch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(name: str, device: str) -> torch.dtype:
    if name != "auto":
        return _DTYPES[name]
    if device.startswith("cuda") or cpu_has_native_bf16():
        return torch.bfloat16
    return torch.float32

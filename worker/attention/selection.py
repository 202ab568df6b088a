"""Which attention backend serves: `--attention-backend auto|mojo|torch` on the engine's device."""

from __future__ import annotations

import logging
from typing import Any

import torch

from worker.attention.metadata import AttentionBackend
from worker.attention.mojo_cpu import MojoAttentionBackend
from worker.attention.torch_backend import TorchAttentionBackend

log = logging.getLogger(__name__)


def get_attention_backend(name: str, device: str | torch.device = "cpu", shape: Any = None,
                          dtype: torch.dtype | None = None, block_size: int = 16,
                          kv_dtype: torch.dtype | None = None) -> AttentionBackend:
    """`auto` takes the Mojo kernels where they build and load, and says loudly when it falls back.

    On CUDA the Mojo backend is MILI's GPU module (worker/attention/cuda.py) for the model's attention shape
    (a kernels.builder.gpu_modules.GpuShape), bfloat16 and 16-token blocks; `mojo` there fails with the reason when it
    cannot serve, and `auto` falls back to the torch reference, saying why. On the CPU, kv_dtype (the cache's)
    decides who attends prefill chunks (worker/attention/mojo_cpu.default_prefill)."""
    if name not in ("auto", "mojo", "torch"):
        raise ValueError(f"unknown attention backend {name!r} (choose auto, mojo or torch)")
    device = torch.device(device)
    if name == "torch":
        return TorchAttentionBackend()
    if device.type == "cuda":
        return _cuda_backend(name, device, shape, dtype, block_size)
    if device.type != "cpu":
        if name == "mojo":
            raise ValueError(f"the mojo attention backend runs on the CPU and CUDA only, not on {device}")
        return TorchAttentionBackend()
    try:
        return MojoAttentionBackend(kv_dtype=kv_dtype)
    except Exception as e:  # a failed build or load: compiler errors, missing runtime libraries, ...
        if name == "mojo":
            raise RuntimeError(f"the mojo attention backend is unavailable: {e}") from e
        log.warning("MOJO ATTENTION KERNELS UNAVAILABLE, falling back to the torch reference: %s", e)
        return TorchAttentionBackend()


def _cuda_backend(name: str, device: torch.device, shape: Any, dtype: torch.dtype | None,
                  block_size: int) -> AttentionBackend:
    try:
        if shape is None or dtype is None:
            raise ValueError("the GPU attention module needs the model's attention shape and dtype")
        from worker.attention.cuda import MojoCudaAttentionBackend

        return MojoCudaAttentionBackend(shape, dtype, block_size, device)
    except Exception as e:  # not built for this shape, not loadable, no device, a failed self-check, ...
        if name == "mojo":
            raise RuntimeError(f"the mojo attention backend is unavailable on {device}: {e}") from e
        log.warning("GPU ATTENTION MODULE UNAVAILABLE on %s, falling back to the torch reference: %s", device, e)
        return TorchAttentionBackend()

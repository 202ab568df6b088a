"""Which layer ops serve a model (worker/model/layer_ops.py, worker/model/compiled_ops.py)."""

from __future__ import annotations

import torch

from worker.attention.metadata import AttentionBackend
from worker.attention.mojo_cpu import MojoAttentionBackend
from worker.checkpoint.model_config import ModelConfig
from worker.model.layer_ops import LayerOps, MojoLayerOps, TorchLayerOps


def get_layer_ops(backend: AttentionBackend, cfg: ModelConfig, device: torch.device | str = "cpu",
                  compiled: bool = False) -> LayerOps:
    """The fused Mojo kernels wherever the Mojo attention backend serves on the CPU and the model's sizes suit them
    (rows of whole 8-lane vectors, rotary halves too); elsewhere with `compiled`, the reference's operators fused by
    torch.compile (meant for CUDA; on the CPU Inductor needs a C++ compiler); else the reference."""
    fits = cfg.head_dim % 16 == 0 and cfg.hidden_size % 8 == 0 and cfg.intermediate_size % 8 == 0
    on = torch.device(device).type
    if isinstance(backend, MojoAttentionBackend) and on == "cpu" and fits:
        return MojoLayerOps()
    if compiled:
        from worker.model.compiled_ops import CompiledLayerOps  # imports torch's compiler stack only when asked

        return CompiledLayerOps(backend)
    return TorchLayerOps(backend)

"""Load an HF-format checkpoint (safetensors only) into a DecoderForCausalLM, checking every tensor.

Every parameter of the model must be filled exactly once with a tensor of the right shape, and every
tensor in the checkpoint must be used (or be one we know to be redundant); anything else is an error
naming the tensor. Files are memory-mapped by safetensors, so loading never holds two copies.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from worker.attention.metadata import AttentionBackend
from worker.checkpoint.files import WeightLoadError, checkpoint_files
from worker.checkpoint.model_config import ModelConfig
from worker.model.decoder import DecoderForCausalLM
from worker.model.layer_ops import LayerOps
from worker.quant.sources import QuantPlan

# Checkpoint tensors that carry nothing we need: older exports store the rotary table they computed.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)

# Separate checkpoint projections -> (fused parameter, shard index): q|k|v and gate|up.
_FUSED = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}


def load_model(model_dir: str | Path, cfg: ModelConfig, backend: AttentionBackend, dtype: torch.dtype,
               max_positions: int, device: torch.device | str = "cpu", ops: LayerOps | None = None,
               quant: QuantPlan | None = None) -> DecoderForCausalLM:
    """quant: the projections (and head, and embedding) to serve from quantized blocks instead
    (worker/quant/sources.py); their checkpoint weights are skipped, never materialized."""
    model_dir = Path(model_dir)
    model = DecoderForCausalLM(cfg, backend, max_positions, dtype, device="meta", rotary_device=device, ops=ops)
    skipped = set() if quant is None else model.use_quantized(quant)
    # to_empty's empty_like on meta tensors runs through torch._refs, which imports torch._dynamo and sympy
    # (about 50 MiB resident in the worker for nothing); plain empty() allocates the same storage.
    model._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
    params = dict(model.named_parameters())
    shard_sizes = _shard_sizes(cfg)
    filled: dict[str, set[int]] = {}
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                target = _target(name, cfg)
                if target is None:
                    continue
                pname, fused, shard = target
                if pname in skipped:
                    continue
                if pname not in params:
                    raise WeightLoadError(f"unexpected tensor {name!r} in {path.name}")
                _copy(params[pname], f.get_tensor(name), name, fused, shard, shard_sizes)
                done = filled.setdefault(pname, set())
                if shard in done:
                    raise WeightLoadError(f"tensor {name!r} appears twice in the checkpoint")
                done.add(shard)
    _check_complete(params, filled, shard_sizes)
    if quant is not None:
        model.load_quantized(quant)
        quant.drop_source_pages()
    model.eval()
    return model


def _target(name: str, cfg: ModelConfig) -> tuple[str, str | None, int] | None:
    """Checkpoint tensor name -> (model parameter name, fused kind or None, shard index)."""
    if name.endswith(_IGNORED_SUFFIXES):
        return None
    if name == "lm_head.weight" and cfg.tie_word_embeddings:
        return None  # some tied checkpoints store the embedding twice; the embedding wins
    parts = name.removeprefix("model.").split(".")
    if len(parts) >= 2 and parts[-2] in _FUSED:
        fused, shard = _FUSED[parts[-2]]
        return ".".join(parts[:-2] + [fused, parts[-1]]), fused, shard
    return ".".join(parts), None, 0


def _shard_sizes(cfg: ModelConfig) -> dict[str, list[int]]:
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return {"qkv_proj": [q, kv, kv], "gate_up_proj": [cfg.intermediate_size, cfg.intermediate_size]}


def _copy(param: torch.Tensor, tensor: torch.Tensor, name: str, fused: str | None, shard: int,
          shard_sizes: dict[str, list[int]]) -> None:
    dest = param.data
    if fused is not None:  # this tensor fills rows [start, start + size) of the fused weight or bias
        sizes = shard_sizes[fused]
        dest = dest.narrow(0, sum(sizes[:shard]), sizes[shard])
    if tuple(dest.shape) != tuple(tensor.shape):
        raise WeightLoadError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}")
    dest.copy_(tensor)


def _check_complete(params: dict[str, torch.Tensor], filled: dict[str, set[int]],
                    shard_sizes: dict[str, list[int]]) -> None:
    for pname in params:
        kind = pname.split(".")[-2]
        expected = set(range(len(shard_sizes[kind]))) if kind in shard_sizes else {0}
        missing = expected - filled.get(pname, set())
        if missing:
            raise WeightLoadError(f"checkpoint is missing the weights for {pname!r}")

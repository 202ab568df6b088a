"""A Qwen3 checkpoint with random weights, made with transformers from the real model's config (no hub, no
network): what the GPU benchmark serves with MILI and with transformers `generate` alike.

QWEN3_0_6B is Qwen3-0.6B's published config.json, less what a random model does not need; TINY is a two-layer
Qwen3 of the same family (GQA 2:1, q/k norms, tied embeddings) for rehearsing the benchmark on a CPU.
"""

from __future__ import annotations

from pathlib import Path

import torch

QWEN3_0_6B = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1e6,
    tie_word_embeddings=True, hidden_act="silu", attention_bias=False, bos_token_id=151643, eos_token_id=151645)
TINY = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, rms_norm_eps=1e-6, rope_theta=1e6,
    tie_word_embeddings=True, hidden_act="silu", attention_bias=False, bos_token_id=1, eos_token_id=2)


def build_checkpoint(out_dir: Path, spec: dict, dtype: torch.dtype, device: torch.device, seed: int) -> Path:
    """Saves a random Qwen3ForCausalLM with `spec`'s config to out_dir (config.json, generation_config.json,
    model.safetensors) in `dtype`. The weights are drawn on `device` (on a GPU the 0.6B model's 600M draws take
    milliseconds, on the CPU seconds); the seed fixes them for a given device."""
    import transformers

    config = transformers.Qwen3Config(**spec)
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.Qwen3ForCausalLM(config)
    model.to(dtype).save_pretrained(out_dir, safe_serialization=True)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out_dir

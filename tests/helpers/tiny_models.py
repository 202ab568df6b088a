"""Random tiny Qwen3 / Qwen2 / Llama checkpoints built with transformers, the engine's oracle."""

from __future__ import annotations

from pathlib import Path

import torch

# name -> config overrides; together they cover GQA ratios 1, 2, 4, tied and untied embeddings,
# head_dim != hidden / heads, qkv bias (Qwen2), q/k/v/o and MLP biases (Llama's attention_bias, mlp_bias),
# q/k norm, and llama3 and YaRN rope scaling (YaRN's interpolated frequencies and attention factor change every
# position's rotation, short prompts' included).
TINY_MODELS: dict[str, dict] = {
    "qwen3": dict(arch="Qwen3", hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  tie_word_embeddings=True),
    "qwen2": dict(arch="Qwen2", hidden_size=64, num_attention_heads=8, num_key_value_heads=2,
                  tie_word_embeddings=False,
                  rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}),
    "llama": dict(arch="Llama", hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                  tie_word_embeddings=False, attention_bias=True, mlp_bias=True,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
}
# Architectures served through another's decoder: built on request, not iterated by every parity test.
MORE_TINY_MODELS: dict[str, dict] = {
    # Llama's decoder with Mistral's sliding window (none here; tests set one) and head_dim * heads != hidden.
    "mistral": dict(arch="Mistral", hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    tie_word_embeddings=False, sliding_window=None),
}


def build_tiny_model(name: str, seed: int, out_dir: Path, vocab_size: int = 320, num_layers: int = 2,
                     max_positions: int = 512, **overrides):
    """Save a random model to out_dir (safetensors + generation_config) and return it (float32, eval).
    overrides: config fields that replace the named model's (head counts, sizes)."""
    import transformers

    spec = dict((TINY_MODELS | MORE_TINY_MODELS)[name]) | overrides
    arch = spec.pop("arch")
    config_cls = getattr(transformers, f"{arch}Config")
    model_cls = getattr(transformers, f"{arch}ForCausalLM")
    config = config_cls(**(dict(
        vocab_size=vocab_size, intermediate_size=128, num_hidden_layers=num_layers,
        max_position_embeddings=max_positions, rms_norm_eps=1e-6, rope_theta=10000.0,
        # A wider init than the default 0.02 keeps the logits peaked, so greedy picks are not near-ties.
        initializer_range=0.25, bos_token_id=1, eos_token_id=2, pad_token_id=0) | spec))
    torch.manual_seed(seed)
    model = model_cls(config).float().eval()
    with torch.no_grad():  # the default init leaves biases at zero; make them matter
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
                if proj.bias is not None:
                    proj.bias.normal_(0, 0.25)
    model.save_pretrained(out_dir, safe_serialization=True)
    model.config._attn_implementation = "eager"
    return model

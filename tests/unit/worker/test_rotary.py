"""Rotary tables against transformers' own rotary embedding, bit for bit, for every supported scaling."""

import pytest
import torch
import transformers
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from worker.checkpoint.model_config import ModelConfig, UnsupportedModelError
from worker.model.rotary import RotaryEmbedding

HEAD_DIM, POSITIONS = 64, 2048

SCALINGS = {
    "none": None,
    "linear": {"rope_type": "linear", "factor": 2.5},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 256},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
    "yarn-betas-untruncated": {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 300,
                               "beta_fast": 16, "beta_slow": 2, "truncate": False},
    "yarn-mscale": {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 64,
                    "mscale": 1.0, "mscale_all_dim": 0.707},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024,
                              "attention_factor": 0.9},
}


def _config(scaling: dict | None, max_positions: int = 1024) -> transformers.Qwen3Config:
    return transformers.Qwen3Config(hidden_size=256, num_attention_heads=4, head_dim=HEAD_DIM,
                                    max_position_embeddings=max_positions, rope_theta=1e6, rope_scaling=scaling)


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_tables_are_transformers_bits(name):
    config = _config(SCALINGS[name])
    ours = RotaryEmbedding(HEAD_DIM, POSITIONS, 1e6, ModelConfig.from_dicts(_model_dict(config)).rope_scaling)
    reference = Qwen3RotaryEmbedding(config)
    positions = torch.arange(POSITIONS)[None]
    cos, sin = reference(torch.zeros(1, dtype=torch.float32), positions)
    half = HEAD_DIM // 2
    sin_signed = torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)
    assert torch.equal(ours.cos, cos[0]) and torch.equal(ours.sin_signed, sin_signed)
    for dtype in (torch.bfloat16, torch.float16):  # the step's tables are the reference's, cast the same way
        ours_cos, _ = ours.tables(torch.arange(POSITIONS), dtype)
        ref_cos, _ = reference(torch.zeros(1, dtype=dtype), positions)
        assert torch.equal(ours_cos[:, 0], ref_cos[0])


@pytest.mark.parametrize("scaling, max_positions, context", [
    (None, 40960, 40960),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 40960, 131072),
    ({"rope_type": "linear", "factor": 2.0}, 4096, 8192),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, 131072, 131072),
])
def test_context_length_follows_the_scaling(scaling, max_positions, context):
    assert ModelConfig.from_dicts(_model_dict(_config(scaling, max_positions))).context_length == context


@pytest.mark.parametrize("scaling, message", [
    ({"rope_type": "dynamic", "factor": 2.0}, "unsupported rope_scaling type 'dynamic'"),
    ({"rope_type": "longrope", "factor": 2.0}, "unsupported rope_scaling type 'longrope'"),
    ({"rope_type": "yarn", "factor": 4.0}, "needs 'original_max_position_embeddings'"),
    ({"rope_type": "linear"}, "needs 'factor'"),
    ({"rope_type": "linear", "factor": 0.5}, "at least 1"),
    ("yarn", "must be an object"),
])
def test_bad_scalings_are_refused_by_name(scaling, message):
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_dicts({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 8, "hidden_size": 64,
                                "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                                "rope_scaling": scaling})


def _model_dict(config: transformers.Qwen3Config) -> dict:
    return config.to_dict() | {"architectures": ["Qwen3ForCausalLM"]}

"""Checkpoint loading: every tensor checked, unsupported settings refused by name, sharded checkpoints,
KV-cache sizing and dtype resolution."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from shared.config import EngineConfig, parse_size
from tests.helpers.engine_probe import assert_matches_reference, make_engine, run_greedy
from tests.helpers.tiny_models import build_tiny_model
from worker.attention.torch_backend import TorchAttentionBackend
from worker.checkpoint.model_config import ModelConfig, UnsupportedModelError
from worker.model.dtype import resolve_dtype
from worker.model.weight_loader import WeightLoadError, load_model
from worker.runner.kv_cache import bytes_per_block


@pytest.fixture
def qwen2_dir(tmp_path, test_seed):
    model_dir = tmp_path / "qwen2"
    build_tiny_model("qwen2", test_seed, model_dir)
    return model_dir


def load(model_dir):
    cfg = ModelConfig.from_dir(model_dir)
    return load_model(model_dir, cfg, TorchAttentionBackend(), torch.float32, 64)


def rewrite_checkpoint(model_dir, edit):
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_fused_weights_hold_the_checkpoint_tensors(qwen2_dir):
    model = load(qwen2_dir)
    ckpt = load_file(qwen2_dir / "model.safetensors")
    attn = model.layers[1].self_attn
    q, k, v = attn.qkv_proj.weight.split([attn.q_size, attn.kv_size, attn.kv_size])
    assert torch.equal(q, ckpt["model.layers.1.self_attn.q_proj.weight"])
    assert torch.equal(v, ckpt["model.layers.1.self_attn.v_proj.weight"])
    assert torch.equal(attn.qkv_proj.bias[attn.q_size:attn.q_size + attn.kv_size],
                       ckpt["model.layers.1.self_attn.k_proj.bias"])
    gate, up = model.layers[0].mlp.gate_up_proj.weight.chunk(2)
    assert torch.equal(up, ckpt["model.layers.0.mlp.up_proj.weight"])


def test_missing_tensor_is_named(qwen2_dir):
    rewrite_checkpoint(qwen2_dir, lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
    with pytest.raises(WeightLoadError, match=r"missing the weights for 'layers.1.self_attn.qkv_proj.bias'"):
        load(qwen2_dir)


def test_wrong_shape_is_named(qwen2_dir):
    def shrink(t):
        t["model.layers.0.mlp.down_proj.weight"] = t["model.layers.0.mlp.down_proj.weight"][:, :-1].contiguous()
    rewrite_checkpoint(qwen2_dir, shrink)
    with pytest.raises(WeightLoadError, match=r"'model.layers.0.mlp.down_proj.weight' has shape \(64, 127\), "
                                              r"expected \(64, 128\)"):
        load(qwen2_dir)


def test_unexpected_tensor_is_named(qwen2_dir):
    rewrite_checkpoint(qwen2_dir, lambda t: t.update({"model.layers.0.mystery.weight": torch.zeros(3)}))
    with pytest.raises(WeightLoadError, match="unexpected tensor 'model.layers.0.mystery.weight'"):
        load(qwen2_dir)


def test_pickled_checkpoints_are_not_loaded(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    cfg = ModelConfig.from_dicts({"architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 8,
                                  "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2})
    with pytest.raises(WeightLoadError, match="no \\*.safetensors"):
        load_model(tmp_path, cfg, TorchAttentionBackend(), torch.float32, 16)


@pytest.mark.parametrize("setting, message", [
    ({"architectures": ["GemmaForCausalLM"]}, "unsupported architecture"),
    ({"architectures": ["MistralForCausalLM"], "sliding_window": 0}, "sliding_window must be a positive integer"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"use_sliding_window": True, "sliding_window": 0, "max_window_layers": 0, "layer_types": None},
     "sliding_window must be"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "rope_scaling type 'dynamic'"),
    ({"layer_types": ["full_attention", "linear_attention"]}, "linear_attention"),
])
def test_unsupported_settings_are_refused_by_name(qwen2_dir, setting, message):
    config = json.loads((qwen2_dir / "config.json").read_text())
    config.update(setting)
    (qwen2_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_dir(qwen2_dir)


def test_sharded_checkpoint_with_index(tmp_path, test_seed):
    model_dir = tmp_path / "sharded"
    hf_model = build_tiny_model("qwen3", test_seed, model_dir)
    hf_model.save_pretrained(model_dir, max_shard_size="100KB")
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    run = run_greedy(make_engine(model_dir), [[5, 6, 7, 8, 9]], 8)
    assert_matches_reference(run, hf_model)


def test_kv_cache_sized_by_memory(tmp_path, test_seed):
    model_dir = tmp_path / "llama"
    build_tiny_model("llama", test_seed, model_dir)
    cfg = ModelConfig.from_dir(model_dir)
    per_block = bytes_per_block(cfg, 16, torch.float32)
    assert per_block == 2 * cfg.num_layers * 16 * cfg.num_kv_heads * cfg.head_dim * 4
    engine = make_engine(model_dir, num_kv_blocks=None, kv_cache_memory=per_block * 37 + 5)
    assert engine.block_manager.num_blocks == 37
    assert engine.runner.kv_caches[0][0].shape == (37, 16, cfg.num_kv_heads, cfg.head_dim)


def test_parse_size():
    assert parse_size("4GiB") == 4 << 30
    assert parse_size("512M") == 512 << 20
    assert parse_size("1000") == 1000
    with pytest.raises(ValueError, match="cannot read"):
        parse_size("lots")


def test_dtype_resolution(monkeypatch):
    assert resolve_dtype("float16", "cpu") is torch.float16
    assert resolve_dtype("auto", "cuda") is torch.bfloat16
    monkeypatch.setattr("worker.model.dtype.cpu_has_native_bf16", lambda: False)
    assert resolve_dtype("auto", "cpu") is torch.float32
    monkeypatch.setattr("worker.model.dtype.cpu_has_native_bf16", lambda: True)
    assert resolve_dtype("auto", "cpu") is torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be one of"):
        EngineConfig(model="x", dtype="int8")

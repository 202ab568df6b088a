"""Tests for the streamed safetensors writer (shared.gguf_import.safetensors_stream) and the GGUF conversion
that uses it: safetensors itself reads the files back; converting holds one tensor, not the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize
from safetensors import safe_open
from safetensors.torch import load_file

from shared.gguf_import.reader import GGUFFile
from shared.gguf_import.safetensors_stream import PlannedTensor, write_streamed

REPO = Path(__file__).resolve().parents[3]


def planned(name: str, value: torch.Tensor) -> PlannedTensor:
    return PlannedTensor(name, value.dtype, tuple(value.shape), lambda: value)


def test_safetensors_reads_back_every_dtype_and_shape(tmp_path):
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    values = {
        "a.f32": torch.randn(7, 5, generator=g),
        "b.f16": torch.randn(3, generator=g).half(),
        "c.bf16": torch.randn(2, 3, 5, generator=g).bfloat16(),  # 30 bytes: the next tensor starts unaligned
        "d.scalar": torch.tensor(1.5),
        "e.empty": torch.zeros(0, 4),
        "f.transposed": torch.randn(4, 6, generator=g).t(),  # not contiguous: written in logical order
    }
    path = tmp_path / "m.safetensors"
    write_streamed(path, [planned(n, v) for n, v in values.items()], metadata={"format": "pt"})
    loaded = load_file(str(path))
    assert loaded.keys() == values.keys()
    for name, value in values.items():
        assert loaded[name].dtype == value.dtype and torch.equal(loaded[name], value), name
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    assert (8 + header_len) % 8 == 0  # the data starts aligned, as safetensors writes it
    json.loads(path.read_bytes()[8:8 + header_len])


def test_made_tensor_must_match_its_plan(tmp_path):
    bad_shape = PlannedTensor("w", torch.float32, (2, 3), lambda: torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"w: made torch.float32 \(3, 2\), planned torch.float32 \(2, 3\)"):
        write_streamed(tmp_path / "a.safetensors", [bad_shape], metadata={})
    bad_dtype = PlannedTensor("v", torch.float16, (2,), lambda: torch.zeros(2))
    with pytest.raises(ValueError, match="v: made torch.float32"):
        write_streamed(tmp_path / "b.safetensors", [bad_dtype], metadata={})
    with pytest.raises(ValueError, match="dtype torch.int64 cannot be written"):
        write_streamed(tmp_path / "c.safetensors", [planned("i", torch.arange(3))], metadata={})


def test_qwen2_without_qkv_biases_gets_zero_biases(tmp_path, monkeypatch):
    import tests.unit.shared.test_gguf_convert as gc
    from shared.gguf_import.convert import convert_gguf

    model, cfg = gc.tiny_model("qwen2", 3)
    all_tensors = gc.gguf_tensors
    monkeypatch.setattr(gc, "gguf_tensors", lambda *a: {n: t for n, t in all_tensors(*a).items()
                                                         if not n.endswith(".bias")})
    out = convert_gguf(gc.write_gguf(tmp_path / "m.gguf", "qwen2", model, cfg), tmp_path / "hf")
    weights = load_file(str(out / "model.safetensors"))
    head_dim = gc.head_dim_of(cfg)
    for i in range(cfg.num_hidden_layers):
        for proj, heads in (("q_proj", cfg.num_attention_heads), ("k_proj", cfg.num_key_value_heads),
                            ("v_proj", cfg.num_key_value_heads)):
            bias = weights[f"model.layers.{i}.self_attn.{proj}.bias"]
            assert bias.dtype == torch.float32 and torch.equal(bias, torch.zeros(heads * head_dim))
    weight = weights["model.layers.0.self_attn.q_proj.weight"]
    assert torch.equal(weight, model.model.layers[0].self_attn.q_proj.weight.detach())


_PEAK_SCRIPT = """
import sys
from shared.gguf_import.convert import convert_gguf

def status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

before = status_kib("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM, the peak resident set, to the current one
convert_gguf(sys.argv[1], sys.argv[2])
print((status_kib("VmHWM") - before) * 1024)
"""


def test_conversion_holds_one_tensor_not_the_model(tmp_path):
    """A Q8_0 model whose float32 weights are ~200 MiB, largest tensor 3 MiB: converting must hold neither
    them all (it did: every tensor was dequantised before the file was written) nor every page of the GGUF."""
    import tests.unit.shared.test_gguf_convert as gc

    model, cfg = gc.tiny_model("llama", 5, hidden_size=512, intermediate_size=1536, num_hidden_layers=16,
                               num_attention_heads=8, num_key_value_heads=4)
    src = gc.write_gguf(tmp_path / "m.gguf", "llama", model, cfg, QT.Q8_0)
    float32_bytes = sum(p.numel() for p in model.parameters()) * 4
    del model
    run = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(src), str(tmp_path / "hf")], cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    growth = int(run.stdout.split()[-1])
    # Allowed: the largest tensor (3 MiB in float32) and its bytes in flight, the tokenizer, allocator slack.
    allowed = 32 * 2**20
    print(f"float32 weights {float32_bytes / 2**20:.0f} MiB, GGUF {src.stat().st_size / 2**20:.0f} MiB, "
          f"peak growth while converting {growth / 2**20:.0f} MiB")
    assert float32_bytes > 4 * allowed  # the test can tell the two ways apart
    assert growth < allowed
    # Dequantised a chunk of rows at a time: a 1536-row tensor crosses a chunk edge, and is still exact.
    converted = load_file(str(tmp_path / "hf" / "model.safetensors"))
    with GGUFFile(src) as f:
        expected = dequantize(f.raw(f.tensors["blk.15.ffn_up.weight"]), QT.Q8_0)
    assert expected.shape == (1536, 512)
    assert np.array_equal(converted["model.layers.15.mlp.up_proj.weight"].numpy(), expected)

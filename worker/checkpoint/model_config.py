"""The model's shape, read from an HF-format config.json and checked against what the engine supports.

Anything we cannot run exactly (unknown rope scaling, other activations, attention other than causal) is refused
here with a message naming the setting, so a model never silently produces wrong tokens. A sliding window (Mistral's,
or Qwen2's and Qwen3's use_sliding_window) is served up to the window's length, where it is full causal attention.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from worker.checkpoint.rope_scaling import RopeScaling, RopeScalingError, parse_rope_scaling, scaled_context_length

# Mistral is Llama's decoder with an optional sliding window (see sliding_window below).
SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")
# The same decoders with a sequence-classification head (`score`, on the last token) instead of the LM head.
CLASSIFIER_ARCHITECTURES = {a.replace("ForCausalLM", "ForSequenceClassification"): a for a in SUPPORTED_ARCHITECTURES}


class UnsupportedModelError(ValueError):
    pass


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2, and Llama or Qwen3 with attention_bias
    o_bias: bool  # Llama or Qwen3 with attention_bias (Qwen2's output projection has none)
    mlp_bias: bool  # Llama's mlp_bias: gate, up and down projections with biases
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before rope
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    torch_dtype: str | None
    num_labels: int = 0  # a sequence classifier's outputs; 0: a causal LM
    # The sliding window of the layers that have one: a token attends to itself and the window - 1 tokens before
    # it. Within that many tokens this is full causal attention, so the model is served up to it (vLLM's rule for
    # backends without sliding-window kernels); None: no layer has a window.
    sliding_window: int | None = None

    @property
    def context_length(self) -> int:
        """The longest sequence the model serves: max_position_embeddings, stretched by linear or YaRN scaling,
        at most the sliding window."""
        return self._context()[0]

    @property
    def context_length_source(self) -> str:
        """Where context_length comes from, for messages."""
        return self._context()[1]

    def _context(self) -> tuple[int, str]:
        length, source = scaled_context_length(self.rope_scaling, self.max_position_embeddings)
        if self.sliding_window is not None and self.sliding_window < length:
            return self.sliding_window, (f"sliding_window {self.sliding_window}: past it the model needs "
                                         "sliding-window attention, which MILI does not run")
        return length, source

    @classmethod
    def from_dir(cls, model_dir: str | Path, overrides: dict | None = None) -> ModelConfig:
        """overrides: config.json keys to replace (`--hf-overrides`); an object merges into the one it replaces, so
        `{"rope_parameters": {"rope_type": "yarn", ...}}` keeps the checkpoint's rope_theta beside it."""
        model_dir = Path(model_dir)
        cfg = _read_json(model_dir / "config.json")
        if cfg is None:
            raise UnsupportedModelError(f"{model_dir} has no config.json")
        cfg = _merged(cfg, overrides or {})
        gen = _read_json(model_dir / "generation_config.json") or {}
        return cls.from_dicts(cfg, gen)

    @classmethod
    def from_dicts(cls, cfg: dict, gen: dict | None = None) -> ModelConfig:
        gen = gen or {}
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        classifier = next((a for a in archs if a in CLASSIFIER_ARCHITECTURES), None)
        num_labels = 0
        if arch is None and classifier is not None:
            arch, num_labels = CLASSIFIER_ARCHITECTURES[classifier], _num_labels(cfg)
        if arch is None:
            raise UnsupportedModelError(
                f"unsupported architecture {archs!r}; supported: "
                f"{', '.join([*SUPPORTED_ARCHITECTURES, *CLASSIFIER_ARCHITECTURES])}")
        _refuse_unsupported_settings(cfg)
        num_heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        head_dim = cfg.get("head_dim") or hidden // num_heads
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None:  # transformers 5 nests it under rope_parameters
            rope_theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=_rope_scaling(cfg),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            o_bias=arch != "Qwen2ForCausalLM" and bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            eos_token_ids=_eos_ids(gen.get("eos_token_id", cfg.get("eos_token_id"))),
            bos_token_id=gen.get("bos_token_id", cfg.get("bos_token_id")),
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            num_labels=num_labels,
            sliding_window=_sliding_window(arch, cfg),
        )


def _sliding_window(arch: str, cfg: dict) -> int | None:
    """The window, where some layer has one, as transformers decides: Mistral's sliding_window covers every layer
    (null: none); Qwen2's and Qwen3's counts only under use_sliding_window, in the layers layer_types marks
    sliding_attention (without layer_types, those from max_window_layers on); Llama has none."""
    window = cfg.get("sliding_window")
    if arch == "LlamaForCausalLM" or window is None:
        return None
    if arch != "MistralForCausalLM":
        if not cfg.get("use_sliding_window"):
            return None
        layer_types = cfg.get("layer_types") or [
            "sliding_attention" if i >= cfg.get("max_window_layers", 28) else "full_attention"
            for i in range(cfg["num_hidden_layers"])]
        if "sliding_attention" not in layer_types:
            return None
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise UnsupportedModelError(f"sliding_window must be a positive integer, got {window!r}")
    return window


def _merged(base: dict, overrides: dict) -> dict:
    out = dict(base)
    for key, value in overrides.items():
        both_objects = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both_objects else value
    return out


def _rope_scaling(cfg: dict) -> RopeScaling | None:
    try:
        return parse_rope_scaling(cfg)
    except RopeScalingError as e:
        raise UnsupportedModelError(str(e)) from None


def _num_labels(cfg: dict) -> int:
    """transformers writes id2label (one entry per label); num_labels is its constructor's name."""
    return len(cfg.get("id2label") or {}) or int(cfg.get("num_labels", 2))


def _read_json(path: Path) -> dict | None:
    if not path.exists():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _eos_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _refuse_unsupported_settings(cfg: dict) -> None:
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"unsupported hidden_act {act!r} (only 'silu')")
    layer_types = cfg.get("layer_types") or []
    other = sorted({t for t in layer_types if t not in ("full_attention", "sliding_attention")})
    if other:
        raise UnsupportedModelError(f"unsupported layer_types {other} (only full_attention and sliding_attention)")

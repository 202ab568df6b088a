"""A checkpoint's `rope_scaling`: how it stretches rotary frequencies past the context it was trained on.

Read from config.json (`rope_scaling`, or transformers 5's `rope_parameters`) with transformers' defaults, so
the engine's rotary tables are the reference's (worker/model/rotary.py computes them). Kinds whose frequencies
would depend on the batch (transformers' `dynamic` rescales with the longest sequence in it) or that belong to
other model families are refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class RopeScalingError(ValueError):
    pass


@dataclass(frozen=True)
class LinearRope:
    """Position interpolation: every frequency divided by `factor`."""

    factor: float


@dataclass(frozen=True)
class Llama3Rope:
    """Llama 3.1/3.2: high frequencies kept, low ones divided by `factor`, a smooth blend between."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class YarnRope:
    """YaRN (Qwen2.5 and Qwen3 long contexts): dimensions that turn fewer than `beta_slow` times over the
    original context are interpolated, those turning more than `beta_fast` times kept, a linear ramp between;
    cos and sin are multiplied by `attention_factor`."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float
    beta_slow: float
    attention_factor: float
    truncate: bool


RopeScaling = LinearRope | Llama3Rope | YarnRope
SUPPORTED_KINDS = ("linear", "llama3", "yarn")


def parse_rope_scaling(cfg: dict) -> RopeScaling | None:
    """None where the checkpoint uses plain rotary embeddings."""
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or None
    if not scaling:
        return None
    if not isinstance(scaling, dict):
        raise RopeScalingError(f"rope_scaling must be an object, got {scaling!r}")
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    try:
        if kind == "default":
            return None
        if kind == "linear":
            return LinearRope(factor=_factor(scaling))
        if kind == "llama3":
            return Llama3Rope(factor=_factor(scaling), low_freq_factor=float(scaling["low_freq_factor"]),
                              high_freq_factor=float(scaling["high_freq_factor"]),
                              original_max_position_embeddings=int(scaling["original_max_position_embeddings"]))
        if kind == "yarn":
            return _yarn(scaling, cfg.get("max_position_embeddings"))
    except KeyError as e:
        raise RopeScalingError(f"rope_scaling type {kind!r} needs {e.args[0]!r}") from None
    raise RopeScalingError(f"unsupported rope_scaling type {kind!r} (supported: {', '.join(SUPPORTED_KINDS)})")


def scaled_context_length(scaling: RopeScaling | None, max_position_embeddings: int) -> tuple[int, str]:
    """The longest context the scaled model serves, and where it comes from (for messages), by vLLM's rule: YaRN
    stretches the original context by its factor, linear stretches max_position_embeddings; llama3 checkpoints
    already state their full length."""
    if isinstance(scaling, YarnRope):
        original = scaling.original_max_position_embeddings
        return int(original * scaling.factor), f"YaRN: original_max_position_embeddings {original} x {scaling.factor}"
    if isinstance(scaling, LinearRope):
        return (int(max_position_embeddings * scaling.factor),
                f"linear rope scaling: max_position_embeddings {max_position_embeddings} x {scaling.factor}")
    return max_position_embeddings, f"max_position_embeddings {max_position_embeddings}"


def _factor(scaling: dict) -> float:
    factor = float(scaling["factor"])
    if not factor >= 1.0:
        raise RopeScalingError(f"rope_scaling factor must be at least 1, got {factor}")
    return factor


def _yarn(scaling: dict, max_position_embeddings: int | None) -> YarnRope:
    original = int(scaling["original_max_position_embeddings"])
    if scaling.get("factor") is None and max_position_embeddings:  # DeepSeek-style: the ratio of the two lengths
        factor = max_position_embeddings / original
    else:
        factor = _factor(scaling)
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    # transformers treats a beta of 0 (or null) as unset, hence `or`.
    return YarnRope(factor=factor, original_max_position_embeddings=original,
                    beta_fast=float(scaling.get("beta_fast") or 32), beta_slow=float(scaling.get("beta_slow") or 1),
                    attention_factor=float(attention_factor), truncate=bool(scaling.get("truncate", True)))


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0

"""Recover HF's llama3 `rope_scaling` from the `rope_freqs.weight` tensor of a llama.cpp GGUF.

llama.cpp's converter does not store Llama 3.1's scaling parameters as metadata; it bakes them into
one divisor per rotary frequency (`rope_freqs`):

    wavelen < original/high_freq_factor  -> 1
    wavelen > original/low_freq_factor   -> factor
    otherwise                             -> 1 / ((1 - s) / factor + s),
                                             s = (original/wavelen - low) / (high - low)

`factor` is the largest divisor. The middle band only fixes the line s(1/wavelen), i.e. the ratios
original/(high-low) and low/(high-low), so (low, high, original) are not unique: any triple on that
line gives identical frequencies. We first try Llama 3's published values (1, 4, 8192), then fit the
line with original = 8192, and accept a result only if it reproduces every stored divisor.
"""

from __future__ import annotations

import math

import numpy as np

_LLAMA3_DEFAULTS = (1.0, 4.0, 8192)  # low_freq_factor, high_freq_factor, original_max_position_embeddings
_RTOL = 1e-5


class RopeScalingError(ValueError):
    pass


def llama3_factors(inv_freq: np.ndarray, factor: float, low: float, high: float, original: float) -> np.ndarray:
    """The divisors llama.cpp's convert_hf_to_gguf.py writes for these llama3 parameters."""
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)
    mid = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, mid))


def llama3_scaling_from_factors(factors: np.ndarray, rope_theta: float, head_dim: int) -> dict | None:
    """HF `rope_scaling` dict reproducing `factors`, None if they scale nothing."""
    inv_freq = 1.0 / (rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if factors.shape != inv_freq.shape:
        raise RopeScalingError(f"has {factors.size} entries, expected head_dim/2 = {inv_freq.size}")
    if np.allclose(factors, 1.0, rtol=_RTOL, atol=0):
        return None
    factor = float(factors.max())
    for low, high, original in _candidates(factors, inv_freq, factor):
        if high > low > 0 and np.allclose(llama3_factors(inv_freq, factor, low, high, original), factors,
                                          rtol=_RTOL, atol=0):
            return {"rope_type": "llama3", "factor": _tidy(factor), "low_freq_factor": _tidy(low),
                    "high_freq_factor": _tidy(high), "original_max_position_embeddings": int(original)}
    raise RopeScalingError(f"divisors {np.round(factors, 4).tolist()} do not follow llama3-style rope scaling")


def _candidates(factors: np.ndarray, inv_freq: np.ndarray, factor: float):
    yield _LLAMA3_DEFAULTS
    middle = (factors > 1 + _RTOL) & (factors < factor * (1 - _RTOL))
    if middle.sum() < 2:
        return
    # In the middle band s is linear in 1/wavelen: s = original/(high-low) * x - low/(high-low).
    x = inv_freq[middle] / (2 * math.pi)
    s = (1 / factors[middle] - 1 / factor) / (1 - 1 / factor)
    slope, intercept = np.polyfit(x, s, 1)
    original = _LLAMA3_DEFAULTS[2]
    span = original / slope
    low = -intercept * span
    yield low, low + span, original


def _tidy(value: float) -> float:
    # Fitted values come back as 0.9999999997; the config should say 1.0.
    return float(f"{value:.6g}")

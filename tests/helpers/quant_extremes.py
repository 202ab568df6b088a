"""Activations at the ends of the quantized matmuls' integer ranges, for the tests that drive their sums to the
largest values they can take."""

from __future__ import annotations

import numpy as np


def full_scale_activations(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    """[rows, k] float32 whose every 32-element block is one value repeated, of random sign per block, so every
    quantized element sits at full scale (127 in int8, 32258 in two parts); row 1 is positive throughout and row 2
    negative, so a block's products all add with one sign."""
    signs = np.where(rng.integers(0, 2, (rows, k // 32)) == 0, -1.0, 1.0)
    x = (np.repeat(signs, 32, axis=1) * rng.uniform(0.5, 3.0, (rows, 1))).astype(np.float32)
    x[1] = np.abs(x[1])
    x[2] = -np.abs(x[2])
    return x

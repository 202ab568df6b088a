"""Tests that need a CUDA device (skipped without one; see conftest.py).

DEVICE is "cuda". MILI_GPU_TESTS_DEVICE=cpu rehearses these tests' own code on the CPU, so that a mistake in a
test is found before a GPU session spends its device time on it; a rehearsal shows nothing about CUDA.
"""

import os

DEVICE = os.environ.get("MILI_GPU_TESTS_DEVICE", "cuda")

# Tiny-model overrides whose attention shapes have carried GPU attention modules (kernels.builder.gpu_modules.CARRIED_SHAPES:
# GQA 2 at head_dim 64, GQA 4 at 64, GQA 1 at 128), so that the mojo backend can serve them. Wider heads on the
# models' 64-wide hidden state: widening the hidden state to 512 instead made Qwen2's and Llama's attention (no q/k
# norms) nearly one-hot, where bfloat16 rounding alone moves logits past the parity check's bounds.
MOJO_TINY = {"qwen3": dict(head_dim=64), "qwen2": dict(head_dim=64), "llama": dict(head_dim=128)}

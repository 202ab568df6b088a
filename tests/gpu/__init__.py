"""Tests that need a CUDA device (skipped without one; see conftest.py).

DEVICE is "cuda". MILI_GPU_TESTS_DEVICE=cpu rehearses these tests' own code on the CPU, so that a mistake in a
test is found before a GPU session spends its device time on it; a rehearsal shows nothing about CUDA.
"""

import os

DEVICE = os.environ.get("MILI_GPU_TESTS_DEVICE", "cuda")

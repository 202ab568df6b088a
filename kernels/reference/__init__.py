"""Torch and NumPy references the kernels are tested against, and random inputs for their tests and benchmarks."""

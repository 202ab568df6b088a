"""Quantized linear weights: llama.cpp's Q4_0, Q4_1 and Q8_0 blocks, taken as they are from a GGUF file or
made from an HF checkpoint at load, repacked once into the tile layout of the Mojo kernel
(kernels/quant_matmul.mojo) and served by QuantLinear. Its own package rather than part of shared/gguf_import/:
safetensors checkpoints are quantized here too, and nothing here reads GGUF metadata."""

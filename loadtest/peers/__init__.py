"""The peers MILI is compared with: llama.cpp's llama-server built from source, and a transformers server."""

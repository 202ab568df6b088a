"""The peers MILI is compared with: llama.cpp's llama-server (and llama-bench) built from source, vLLM's CPU
backend and OpenVINO GenAI each installed into a venv of its own, and a transformers server."""

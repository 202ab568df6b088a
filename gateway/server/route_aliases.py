"""Other spellings of MILI's routes that llama.cpp's server answers too, so that a client set up for llama-server
keeps working: an OpenAI SDK given the server's root without /v1 posts to /chat/completions and reads /models,
Jina-style rerankers post to /reranking. Each alias is its route, with the same methods, answers, errors and
API-key rule (llama-server's /v1/health is open, as /health is)."""

from __future__ import annotations

ALIASES = {"/chat/completions": "/v1/chat/completions", "/responses": "/v1/responses", "/models": "/v1/models",
           "/v1/health": "/health", "/reranking": "/v1/rerank", "/v1/reranking": "/v1/rerank"}


def canonical(path: str) -> str:
    """The route `path` names: itself, or the route it is an alias of."""
    return ALIASES.get(path, path)

"""Response bodies: OpenAI's embeddings list, llama.cpp's, the Jina/Cohere v1 rerank results, Cohere's v2 rerank
results, vLLM's score list."""

from __future__ import annotations

import base64
import math
import struct
import time
import uuid


def matryoshka(vector: list[float], dimensions: int | None) -> list[float]:
    """The first `dimensions` values, re-normalized to unit length (OpenAI's `dimensions`); all of them when None."""
    if dimensions is None or dimensions == len(vector):
        return vector
    return unit_length(vector[:dimensions])


def unit_length(vector: list[float]) -> list[float]:
    """The vector scaled to length 1 (a zero vector as it is)."""
    norm = math.sqrt(math.fsum(v * v for v in vector))
    return [v / norm for v in vector] if norm > 0 else vector


def encode_embedding(vector: list[float], encoding_format: str) -> list[float] | str:
    """base64: the little-endian float32 bytes, which the openai SDK decodes (and asks for by default)."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


def llama_normalized(vector: list[float], p: int) -> list[float]:
    """llama.cpp's embd_normalize (common_embd_normalize): -1 the vector as it is; 0 scaled so its largest magnitude
    is 32760; p >= 1 scaled to unit p-norm, computed in double precision. A zero norm (or one past the doubles,
    for a large p) gives zeros, as llama.cpp's does."""
    if p == -1:
        return vector
    if p == 0:
        total = max((abs(v) for v in vector), default=0.0) / 32760.0
    elif p == 2:
        total = math.sqrt(math.fsum(v * v for v in vector))
    else:
        try:
            total = math.fsum(abs(v) ** p for v in vector) ** (1.0 / p)
        except OverflowError:
            total = math.inf
    scale = 1.0 / total if total > 0 else 0.0
    return [v * scale for v in vector]


def llama_embeddings_body(vectors: list[list[float]]) -> list[dict]:
    """llama.cpp's /embedding answer: per prompt its index and its pooled vector, in a list of one."""
    return [{"index": i, "embedding": [v]} for i, v in enumerate(vectors)]


def _usage(num_tokens: int) -> dict:
    return {"prompt_tokens": num_tokens, "total_tokens": num_tokens}


def embeddings_body(model: str, vectors: list[list[float] | str], num_tokens: int) -> dict:
    return {"object": "list", "model": model, "usage": _usage(num_tokens),
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]}


def _ranked(scores: list[float], top_n: int | None) -> list[int]:
    """Indices sorted by relevance, highest first (ties in the documents' order), cut to top_n (None or 0: all)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return order[:top_n] if top_n else order


def _results(documents: list[str], scores: list[float], top_n: int | None, return_documents: bool) -> list[dict]:
    results = []
    for i in _ranked(scores, top_n):
        result = {"index": i, "relevance_score": scores[i]}
        if return_documents:
            result["document"] = {"text": documents[i]}
        results.append(result)
    return results


def rerank_body(model: str, documents: list[str], scores: list[float], top_n: int | None, return_documents: bool,
                num_tokens: int) -> dict:
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": model, "usage": _usage(num_tokens),
            "results": _results(documents, scores, top_n, return_documents)}


# Cohere bills one search unit per query with up to 100 documents.
_DOCUMENTS_PER_SEARCH_UNIT = 100


def cohere_rerank_body(documents: list[str], scores: list[float], top_n: int | None, return_documents: bool,
                       num_tokens: int) -> dict:
    """Cohere's v2 shape: `id`, `results` and `meta` (its API version, the search units and the input tokens)."""
    return {"id": str(uuid.uuid4()), "results": _results(documents, scores, top_n, return_documents),
            "meta": {"api_version": {"version": "2", "is_experimental": False},
                     "billed_units": {"search_units": -(-len(documents) // _DOCUMENTS_PER_SEARCH_UNIT)},
                     "tokens": {"input_tokens": num_tokens, "output_tokens": 0}}}


def score_body(model: str, scores: list[float], num_tokens: int) -> dict:
    return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": model,
            "data": [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)],
            "usage": _usage(num_tokens)}

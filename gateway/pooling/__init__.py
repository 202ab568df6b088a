"""Embeddings (OpenAI's /v1/embeddings), reranking (/v1/rerank, /rerank) and vLLM's /score: the pooling tasks'
request schema, prompts, response bodies and routes."""

"""OpenAI's Completions and Chat Completions APIs (and vLLM's token-counting routes): request schema, parsing into
typed requests, response bodies, routes."""

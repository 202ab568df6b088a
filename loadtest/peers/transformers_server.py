"""The baseline peer: an OpenAI-style /v1/completions server that runs transformers' `generate`, one
request at a time, the design a first prototype of a serving stack has. `loadtest.sweep` starts it
beside MILI and llama-server so the table shows what continuous batching and paged attention buy.

    python -m loadtest.peers.transformers_server --model DIR --served-model-name NAME --port 8002

Streams one SSE chunk per generated token and ends with a usage chunk, like the others. Requests
wait on one lock, so concurrency only queues them. Same dtype (bfloat16) and threads as MILI's worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
import uuid

import torch
import uvicorn
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.streamers import BaseStreamer


class _QueueStreamer(BaseStreamer):
    """Hands each new token id to the event loop; generate's first `put` is the prompt, skipped."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
        self.loop, self.queue, self.prompt_seen = loop, queue, False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        for token in value.reshape(-1).tolist():
            self.loop.call_soon_threadsafe(self.queue.put_nowait, token)

    def end(self) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, None)


def build_app(model_dir: str, served_name: str) -> Starlette:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    lock = asyncio.Lock()

    def generate(ids: torch.Tensor, body: dict, streamer: _QueueStreamer) -> None:
        max_tokens = int(body.get("max_tokens", 16))
        greedy = float(body.get("temperature", 1.0)) == 0.0
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                           min_new_tokens=max_tokens if body.get("ignore_eos") else 0, do_sample=not greedy,
                           temperature=None if greedy else float(body["temperature"]), top_p=None, top_k=None,
                           streamer=streamer, pad_token_id=tokenizer.eos_token_id)

    async def tokens(ids: torch.Tensor, body: dict):
        """Yields generated token ids while holding the one-request lock."""
        queue: asyncio.Queue = asyncio.Queue()
        async with lock:
            streamer = _QueueStreamer(asyncio.get_running_loop(), queue)
            worker = threading.Thread(target=generate, args=(ids, body, streamer), daemon=True)
            worker.start()
            while (token := await queue.get()) is not None:
                yield token
            worker.join()

    def completion(rid: str, text: str, finish: str | None, usage: dict | None) -> dict:
        choices = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}] if text or finish else []
        return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": served_name,
                "choices": choices, "usage": usage}

    def usage(prompt_len: int, generated: int) -> dict:
        return {"prompt_tokens": prompt_len, "completion_tokens": generated, "total_tokens": prompt_len + generated}

    async def completions(request: Request):
        body = await request.json()
        rid = f"cmpl-{uuid.uuid4().hex}"
        ids = torch.tensor([tokenizer.encode(body["prompt"])])  # [1, prompt_len]
        finish = "length"  # ignore_eos is how the benchmark runs it; a stop at EOS reports as length too
        if not body.get("stream"):
            out = [token async for token in tokens(ids, body)]
            return JSONResponse(completion(rid, tokenizer.decode(out), finish, usage(ids.shape[1], len(out))))

        async def events():
            generated = 0
            async for token in tokens(ids, body):
                generated += 1
                yield json.dumps(completion(rid, tokenizer.decode([token]), None, None))
            yield json.dumps(completion(rid, "", finish, None))
            yield json.dumps(completion(rid, "", None, usage(ids.shape[1], generated)))
            yield "[DONE]"
        return EventSourceResponse(events(), sep="\n")

    async def health(_: Request):
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                             Route("/health", health)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="HF-format model directory")
    p.add_argument("--served-model-name", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8002)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    uvicorn.run(build_app(args.model, args.served_model_name), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

"""transformers `generate` measured the way the GPU benchmark measures MILI's engine: single-stream decode (the
prompt's prefill excluded) and offline throughput over left-padded batches.

Greedy decoding with EOS suppressed until each batch's longest requested output (`min_new_tokens`), so every
sequence runs to its length as MILI's ignore_eos requests do; a batch runs as long as its longest sequence, and only
each sequence's own requested tokens count as output.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers.generation.streamers import BaseStreamer


def load(model_dir: Path, device: torch.device, dtype: torch.dtype, attention: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attention)
    return model.to(device).eval()


class _TokenClock(BaseStreamer):
    """generate() hands a streamer the prompt first, then each new token (already on the host): the time of the
    first new token and of the last, and how many came."""

    def __init__(self):
        self.puts = 0
        self.tokens = 0
        self.first = self.last = 0.0

    def put(self, value):
        self.puts += 1
        if self.puts == 1:
            return  # the prompt
        now = time.perf_counter()
        if self.puts == 2:
            self.first = now
        self.tokens += value.numel()
        self.last = now

    def end(self):
        pass


def _generate(model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, cache: str, **kwargs):
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = model.config.bos_token_id or 0
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False, pad_token_id=pad, **extra, **kwargs)


def warm_up(model, device: torch.device, cache: str) -> None:
    ids = torch.arange(8, device=device).view(1, -1) + 10
    _generate(model, ids, torch.ones_like(ids), 4, cache)


def single_stream(model, prompt: list[int], new_tokens: int, device: torch.device, cache: str) -> dict:
    """Decode tokens/s of one sequence, from its first new token to its last."""
    ids = torch.tensor([prompt], device=device)
    clock = _TokenClock()
    _generate(model, ids, torch.ones_like(ids), new_tokens, cache, streamer=clock)
    decode_s = clock.last - clock.first
    return {"context": len(prompt), "output_tokens": clock.tokens, "decode_s": decode_s,
            "tok_s": (clock.tokens - 1) / decode_s if decode_s > 0 else None}


def offline(model, prompts: list[list[int]], output_lens: list[int], batch: int, device: torch.device, cache: str,
            deadline: float) -> dict:
    """Output tokens/s over `prompts` in left-padded batches of `batch`, in order. A batch still running at the
    deadline stops there (max_time) and counts what it produced; later batches are not started."""
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = model.config.bos_token_id or 0
    produced = prompt_tokens = sequences = batches = 0
    stopped = None
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        left = deadline - time.perf_counter()
        if left <= 1.0:
            stopped = f"budget: {len(prompts) - i} sequences not run"
            break
        chunk, lens = prompts[i:i + batch], output_lens[i:i + batch]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
        out = _generate(model, ids, mask, max(lens), cache, max_time=left)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        generated = out.shape[1] - width
        if generated < max(lens):
            stopped = f"budget: batch {batches} stopped after {generated} of {max(lens)} steps"
        produced += sum(min(n, generated) for n in lens)
        prompt_tokens += sum(map(len, chunk))
        sequences += len(chunk)
        batches += 1
        if stopped:
            break
    elapsed = time.perf_counter() - start
    return {"sequences": sequences, "batches": batches, "batch_size": batch, "output_tokens": produced,
            "prompt_tokens": prompt_tokens, "seconds": elapsed, "complete": stopped is None, "stopped": stopped,
            "output_tok_s": produced / elapsed if elapsed > 0 and produced else None,
            "total_tok_s": (produced + prompt_tokens) / elapsed if elapsed > 0 and produced else None}

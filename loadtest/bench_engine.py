"""Offline engine throughput on the default model, beside transformers' generate in the same process.

    python -m loadtest.bench_engine [--requests 64] [--output-len 64] [--hf-requests 32]

Prints absolute numbers for this machine and the ratios that matter: engine vs transformers, and
engine decode vs the model's matmuls alone (the bound the engine could reach with free attention and
zero overhead). Nothing here asserts; it measures.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from shared.config import EngineConfig
from shared.default_model import default_model_path
from shared.sampling_params import SamplingParams
from worker.engine import LLMEngine
from worker.model.packed_linear import PackedLinear


class StageTimer:
    """Accumulates wall time of wrapped callables, by stage name."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, obj, attr: str, stage: str) -> None:
        fn = getattr(obj, attr)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[stage] += time.perf_counter() - t0

        setattr(obj, attr, timed)

    def install(self, engine: LLMEngine) -> None:
        self.wrap(engine.runner, "prepare", "prepare inputs")
        self.wrap(engine.runner, "execute", "model forward")
        self.wrap(engine.attention_backend, "attend", "  of which attention")
        self.wrap(engine.attention_backend, "write_kv", "  of which KV write")
        self.wrap(engine, "sampler", "sampler")
        self.wrap(engine.scheduler, "schedule", "schedule")

    def since(self, before: dict[str, float]) -> dict[str, float]:
        return {k: v - before.get(k, 0.0) for k, v in self.seconds.items()}


def print_breakdown(seconds: dict[str, float], elapsed: float) -> None:
    for stage, sec in seconds.items():
        print(f"    {stage:<22} {sec:7.2f} s  {100 * sec / elapsed:5.1f}%")
    rest = elapsed - sum(v for k, v in seconds.items() if not k.startswith("  "))
    print(f"    {'rest (update, Python)':<22} {rest:7.2f} s  {100 * rest / elapsed:5.1f}%")


@contextmanager
def stopwatch(label: str, results: dict):
    t0 = time.perf_counter()
    yield
    results[label] = time.perf_counter() - t0


def make_prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def bench_engine(engine: LLMEngine, prompts, output_len: int) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    t0 = time.perf_counter()
    engine.generate(prompts, params)
    return time.perf_counter() - t0


def bench_decode(engine: LLMEngine, timer: StageTimer, batch: int, context: int, steps: int,
                 vocab: int) -> tuple[float, float, dict[str, float]]:
    """Decode at a fixed batch: prefill first (untimed), then time `steps` pure decode steps.
    Returns (tokens/s, seconds, time per stage during the decode steps)."""
    prompts = make_prompts(batch, context, context, vocab, seed=batch)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"decode-{batch}-{i}", p, params)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    before = dict(timer.seconds)
    t0 = time.perf_counter()
    tokens = 0
    while engine.has_unfinished_requests():
        tokens += sum(len(o.new_token_ids) for o in engine.step())
    elapsed = time.perf_counter() - t0
    return tokens / elapsed, elapsed, timer.since(before)


def bench_matmuls(engine: LLMEngine, batch: int, with_head: bool, iters: int = 20) -> float:
    """Tokens/s of the model's linear layers alone at `batch` tokens, with or without the lm_head."""
    model = engine.runner.model
    linears = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, PackedLinear))]
    with torch.inference_mode():
        xs = {m.in_features: torch.randn(batch, m.in_features, dtype=engine.dtype) for m in linears}
        hidden = torch.randn(batch, model.config.hidden_size, dtype=engine.dtype)
        for _ in range(3):
            for m in linears:
                m(xs[m.in_features])
        t0 = time.perf_counter()
        for _ in range(iters):
            for m in linears:
                m(xs[m.in_features])
            if with_head:
                model.compute_logits(hidden)
        return batch * iters / (time.perf_counter() - t0)


def bench_transformers(model_dir, prompts, output_len: int, dtype: torch.dtype, batch: int) -> float:
    """Output tokens/s of transformers' batched generate (left-padded batches of `batch`)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    t0 = time.perf_counter()
    produced = 0
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=output_len,
                                 min_new_tokens=output_len, do_sample=False, pad_token_id=pad)
        produced += (out.shape[1] - width) * len(chunk)
    return produced / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--min-prompt", type=int, default=32)
    ap.add_argument("--max-prompt", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--hf-requests", type=int, default=32, help="requests given to transformers (it is slower)")
    ap.add_argument("--batch", type=int, default=32, help="transformers generate batch size")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--attention-backend", default="auto", choices=("auto", "mojo", "torch"))
    args = ap.parse_args()

    model_dir = default_model_path()
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype=args.dtype, attention_backend=args.attention_backend,
                                    max_model_len=2048))
    vocab = engine.model_config.vocab_size
    print(f"model {model_dir.name}, dtype {engine.dtype}, attention {engine.attention_backend.name}, "
          f"torch threads {torch.get_num_threads()}")
    prompts = make_prompts(args.requests, args.min_prompt, args.max_prompt, vocab, seed=0)
    engine.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # warm-up

    timer = StageTimer()
    timer.install(engine)
    elapsed = bench_engine(engine, prompts, args.output_len)
    out_tokens = args.requests * args.output_len
    in_tokens = sum(map(len, prompts))
    engine_tps = out_tokens / elapsed
    print(f"\nengine offline: {args.requests} requests, prompts {args.min_prompt}..{args.max_prompt} tokens, "
          f"{args.output_len} output tokens each")
    print(f"  {elapsed:.2f} s, {engine_tps:.1f} output tok/s, {(in_tokens + out_tokens) / elapsed:.1f} total tok/s")
    print("  where the time went:")
    print_breakdown(timer.seconds, elapsed)

    print("\ndecode steps alone (context 128) vs the model's matmuls alone:")
    for batch in (1, 32):
        dec, dec_elapsed, decode_stages = bench_decode(engine, timer, batch, context=128, steps=32, vocab=vocab)
        layers = bench_matmuls(engine, batch, with_head=False)
        full = bench_matmuls(engine, batch, with_head=True)
        print(f"  batch {batch:>2}: engine decode {dec:7.1f} tok/s; matmuls alone: layers {layers:7.1f} tok/s, "
              f"layers + lm_head {full:7.1f} tok/s; engine / matmuls {dec / full:.2f}")
        print_breakdown(decode_stages, dec_elapsed)

    if args.hf_requests <= 0:
        return
    hf_prompts = prompts[:args.hf_requests]
    hf_tps = bench_transformers(model_dir, hf_prompts, args.output_len, engine.dtype, args.batch)
    print(f"\ntransformers generate ({len(hf_prompts)} requests, batches of {args.batch}): {hf_tps:.1f} output tok/s")
    print(f"engine / transformers: {engine_tps / hf_tps:.2f}x")


if __name__ == "__main__":
    main()

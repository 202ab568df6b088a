"""Where a decode step's time goes: torch's profiler over steady decode steps of the default model.

    python -m loadtest.profile_step [--batch 1] [--context 128] [--steps 20] [--trace step.json]

Prints the operators by self CPU time and the step's wall time, so the largest measured cost is the
one attacked first. For the Python side, run the same under py-spy:
    py-spy record --native -o step.svg -- python -m loadtest.profile_step --no-profiler
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from loadtest.bench_engine import make_prompts
from shared.config import QUANTIZATIONS, EngineConfig
from shared.sampling_params import SamplingParams
from worker.default_model import default_model_path
from worker.engine import LLMEngine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--attention-backend", default="auto", choices=("auto", "mojo", "torch"))
    ap.add_argument("--quantization", default="auto", choices=QUANTIZATIONS)
    ap.add_argument("--no-profiler", action="store_true", help="only time the steps (for py-spy)")
    ap.add_argument("--trace", help="also write a Chrome trace here")
    ap.add_argument("--rows", type=int, default=25)
    args = ap.parse_args()

    engine = LLMEngine(EngineConfig(model=str(default_model_path()), dtype=args.dtype,
                                    attention_backend=args.attention_backend, max_model_len=2048,
                                    quantization=args.quantization))
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=args.steps * 3 + 8, ignore_eos=True)
    for i, prompt in enumerate(make_prompts(args.batch, args.context, args.context, vocab, seed=1)):
        engine.add_request(f"p{i}", prompt, params)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    for _ in range(args.steps):  # warm-up decode steps
        engine.step()

    t0 = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    step_ms = 1e3 * (time.perf_counter() - t0) / args.steps
    print(f"batch {args.batch}, context {args.context}, dtype {engine.dtype}, attention "
          f"{engine.attention_backend.name}, threads {torch.get_num_threads()}: {step_ms:.2f} ms per decode step "
          f"({1e3 * args.batch / step_ms:.1f} tok/s)")
    if args.no_profiler:
        return
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            engine.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    if args.trace:
        prof.export_chrome_trace(args.trace)


if __name__ == "__main__":
    main()

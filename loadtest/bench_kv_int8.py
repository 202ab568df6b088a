"""The 8- and 16-bit KV caches against the model's float cache, in one run: capacity in a fixed budget, the decode
attention kernel over the same pages in each dtype, and (with --engine) decode steps of the default model.

    python -m loadtest.bench_kv_int8 [--batch 32] [--context 2048] [--engine] [--rounds 5]

The caches are the ones this CPU serves beside its activations: the float cache `auto` keeps (bfloat16 where the CPU
has bfloat16 arithmetic, else float32), float16 beside float32 activations, and int8. Capacity comes from the block
manager: the blocks a --kv-cache-memory budget buys for the default model's shape, and the sequences of --context
tokens they hold. The kernel comparison writes one random cache in each dtype (int8 by kernels/kv_int8.py) and times
paged_attention over each on the calling thread, in alternating rounds, by that thread's CPU time
(time.thread_time): on a shared machine wall time mostly measures the other processes, CPU time much less so; the
ratios are what to read. --engine does the same with one engine per cache (the default model) prefilled to
--context tokens per sequence and stepping --batch decodes. Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from kernels import attention as mojo_attention
from kernels import kv_int8
from kernels.reference.paged_inputs import random_paged_batch
from loadtest.bench_kernels import copy_bandwidth
from loadtest.machine import cpu_name
from shared.default_model import default_model_path
from worker.checkpoint.model_config import ModelConfig
from worker.core.block_manager import BlockManager
from worker.model.dtype import resolve_dtype
from worker.runner.kv_cache import num_blocks_for_memory


def cache_dtypes() -> dict[str, torch.dtype]:
    """--kv-cache-dtype name -> cache dtype, for the caches this CPU serves beside its activations (the first: the
    float cache `auto` keeps, the baseline of every ratio)."""
    activations = resolve_dtype("auto", "cpu")
    caches = {"auto": activations}
    if activations == torch.float32:
        caches["float16"] = torch.float16
    caches["int8"] = torch.int8
    return caches


def label(name: str, dtype: torch.dtype) -> str:
    return f"{name} ({str(dtype).removeprefix('torch.')})" if name == "auto" else name


def capacity(cfg: ModelConfig, budget: int, context: int, block_size: int = 16) -> None:
    print(f"capacity: default model ({cfg.num_layers} layers, {cfg.num_kv_heads} KV heads x {cfg.head_dim}), "
          f"KV budget {budget / 2**30:.2f} GiB, {context}-token sequences")
    for name, dtype in cache_dtypes().items():
        manager = BlockManager(num_blocks_for_memory(cfg, block_size, dtype, budget), block_size, True)
        seqs = manager.num_blocks // -(-context // block_size)
        print(f"  {label(name, dtype):<16} {manager.num_blocks:>7} blocks of {block_size} tokens -> {seqs:>4} "
              "sequences")


def paired(fns: dict[str, callable], rounds: int, calls: int = 3) -> dict[str, float]:
    """Median CPU seconds of this thread per call of each function, measured in alternating rounds."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for name, fn in fns.items():
        fn()  # warm-up
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.thread_time()
            for _ in range(calls):
                fn()
            times[name].append((time.thread_time() - t0) / calls)
    return {k: statistics.median(v) for k, v in times.items()}


def kernel(cfg: ModelConfig, batch: int, context: int, rounds: int) -> None:
    module = mojo_attention.load_module()
    rng = random.Random(0)
    torch.manual_seed(0)
    heads, kv_heads, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    dtypes = cache_dtypes()
    activations = dtypes["auto"]
    b = random_paged_batch(rng, [(context, 1)] * batch, 16, kv_heads, head_dim, activations)
    caches = {}
    for name, dtype in dtypes.items():
        to_cache = kv_int8.to_cache if dtype == torch.int8 else (lambda x, dt=dtype: kv_int8.to_float_cache(x, dt))
        caches[name] = (to_cache(b.k_cache), to_cache(b.v_cache))
    query = torch.randn(batch, heads, head_dim).to(activations)
    fns = {name: (lambda k=k, v=v: mojo_attention.paged_attention(module, query, k, v, b.plan, head_dim ** -0.5))
           for name, (k, v) in caches.items()}
    median = paired(fns, rounds)
    bandwidth = copy_bandwidth()
    print(f"\ndecode attention, one layer: batch {batch} x context {context}, {heads} query heads over {kv_heads} KV "
          f"heads x {head_dim}, one thread, CPU time per call (copy bandwidth {bandwidth / 1e9:.1f} GB/s)")
    for name, (k, _) in caches.items():
        read = 2 * batch * context * kv_heads * kv_int8.row_width(head_dim, k.dtype) * k.element_size()
        print(f"  {label(name, k.dtype):<16} {median[name] * 1e3:8.3f} ms  {read / 2**20:7.1f} MiB read  "
              f"{read / median[name] / 1e9:6.1f} GB/s  {median['auto'] / median[name]:.2f}x auto's speed")
    print(f"  (median of {rounds} alternating rounds)")


def engine_steps(batch: int, context: int, rounds: int, steps: int) -> None:
    from shared.config import EngineConfig
    from shared.sampling_params import SamplingParams
    from worker.engine import LLMEngine
    from loadtest.bench_engine import make_prompts

    engines = {}
    total = steps * (rounds + 1) + 8
    for name in cache_dtypes():
        engine = LLMEngine(EngineConfig(model=str(default_model_path()), kv_cache_dtype=name,
                                        max_model_len=context + total + 16,
                                        num_kv_blocks=batch * -(-(context + total + 16) // 16)))
        params = SamplingParams(temperature=0.0, max_tokens=total, ignore_eos=True)
        for i, prompt in enumerate(make_prompts(batch, context, context, engine.model_config.vocab_size, seed=1)):
            engine.add_request(f"p{i}", prompt, params)
        t0 = time.perf_counter()
        while engine.scheduler.waiting or any(s.num_computed_tokens < s.num_prompt_tokens
                                              for s in engine.scheduler.running):
            engine.step()
        print(f"  {name}: prefilled {batch} x {context} tokens in {time.perf_counter() - t0:.1f} s", flush=True)
        for _ in range(steps):
            engine.step()
        engines[name] = engine
    wall: dict[str, list[float]] = {k: [] for k in engines}
    cpu: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(rounds):
        for name, engine in engines.items():
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(steps):
                engine.step()
            wall[name].append((time.perf_counter() - t0) / steps)
            cpu[name].append((time.process_time() - c0) / steps)
    print(f"\ndecode steps, default model (quantized weights), batch {batch}, context about {context}, "
          f"{torch.get_num_threads()} threads (with one, process CPU time is the work done, whatever else runs):")
    for clock, times in (("wall", wall), ("CPU", cpu)):
        median = {k: statistics.median(v) for k, v in times.items()}
        for name, t in median.items():
            print(f"  {clock:<4} {name:<8} {t * 1e3:8.1f} ms per step  {batch / t:7.1f} tok/s  "
                  f"{median['auto'] / t:.2f}x auto's tok/s")
    print(f"  (medians of {rounds} alternating rounds of {steps} steps)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--budget", default=1 << 30, type=int, help="KV bytes for the capacity table")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--engine", action="store_true", help="also time decode steps of one engine per cache")
    ap.add_argument("--steps", type=int, default=5, help="decode steps per round with --engine")
    ap.add_argument("--threads", type=int, help="torch's threads (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"machine: {cpu_name()}, torch threads {torch.get_num_threads()}")
    cfg = ModelConfig.from_dir(default_model_path())
    capacity(cfg, args.budget, args.context)
    kernel(cfg, args.batch, args.context, args.rounds)
    if args.engine:
        engine_steps(args.batch, args.context, args.rounds, args.steps)


if __name__ == "__main__":
    main()

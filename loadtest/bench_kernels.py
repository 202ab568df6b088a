"""`make bench-kernels`: the Mojo kernels beside the torch reference on the same inputs, in one run.

Shapes are the default model's attention (9 query heads over 3 KV heads, head_dim 64, bfloat16 KV,
16-token blocks scattered over the cache). Decode and KV-write figures also give the bytes per second
achieved, next to this machine's memory bandwidth measured by a large copy in the same run. Prefill is
compared with torch's scaled_dot_product_attention on the same shapes, given contiguous K/V (the
reference backend must first gather the pages; SDPA alone is the bar).

Numbers are printed, never asserted; compare ratios within one run.
"""

from __future__ import annotations

import random
import statistics
import time

import torch
import torch.nn.functional as F

from kernels import attention as mojo_attention
from kernels.reference import attention as reference
from kernels.reference.paged_inputs import random_paged_batch

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
DTYPE = torch.bfloat16


def timed(fn, min_time: float = 0.3, min_runs: int = 5) -> float:
    """Median seconds per call."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes per second of a 512 MiB copy (read + write): the machine's practical memory bandwidth for a copy."""
    src = torch.ones(256 << 20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return 2 * src.numel() / timed(lambda: dst.copy_(src), min_runs=5)


def read_bandwidth() -> float:
    """Bytes per second torch's max over 512 MiB reads at: what reading alone reaches (decode reads weights and
    KV, writes next to nothing). A lower bound of the machine's read bandwidth: a copy's writes cost it more than
    its bytes, and a hand-unrolled read loop goes faster still (50 GB/s on the 2-core Zen 4 EPYC, against ~35 here)."""
    src = torch.ones(128 << 20, dtype=torch.int32)
    return src.numel() * src.element_size() / timed(lambda: src.amax(), min_runs=5)


def batch(seqs: list[tuple[int, int]], rng: random.Random):
    """Random paged caches, plans and queries for (context_len, query_len) per sequence."""
    b = random_paged_batch(rng, seqs, BLOCK, KV_HEADS, HEAD_DIM, DTYPE, num_blocks=None)
    query = torch.randn(b.plan.num_tokens, HEADS, HEAD_DIM).to(DTYPE)
    return b.k_cache, b.v_cache, b.plan, b.ref_plan, query, b.slots


def main() -> None:
    torch.manual_seed(0)
    rng = random.Random(0)
    module = mojo_attention.load_module()
    copy, read = copy_bandwidth(), read_bandwidth()
    print(f"torch threads {torch.get_num_threads()}; memory bandwidth: a copy {copy / 1e9:.1f} GB/s (read + write), "
          f"a read-only reduction {read / 1e9:.1f} GB/s\n")
    scale = HEAD_DIM ** -0.5

    print("paged decode attention (one query token per sequence); 'mojo' runs on the calling thread, 'mojo x2' on")
    print("torch's OpenMP threads, as the engine serves it")
    print(f"{'batch':>5} {'context':>7} | {'torch ref ms':>12} {'mojo ms':>8} {'mojo x2 ms':>10} | {'speedup':>7} "
          f"{'x2 speedup':>10} | {'mojo x2 GB/s':>12} {'of read bw':>10}")
    for context in (128, 1024, 4096):
        for b in (1, 8, 32):
            k_cache, v_cache, plan, ref_plan, query, _ = batch([(context, 1)] * b, rng)
            t_ref = timed(lambda: reference.paged_attention(query, k_cache, v_cache, ref_plan, scale))
            t_one = timed(lambda: mojo_attention.paged_attention(module, query, k_cache, v_cache, plan, scale))
            t_two = timed(lambda: mojo_attention.paged_attention(module, query, k_cache, v_cache, plan, scale,
                                                           threading="omp"))
            kv_bytes = 2 * b * context * KV_HEADS * HEAD_DIM * k_cache.element_size()
            print(f"{b:>5} {context:>7} | {t_ref * 1e3:>12.3f} {t_one * 1e3:>8.3f} {t_two * 1e3:>10.3f} | "
                  f"{t_ref / t_one:>6.1f}x {t_ref / t_two:>9.1f}x | {kv_bytes / t_two / 1e9:>12.1f} "
                  f"{kv_bytes / t_two / read:>9.0%}")

    print("\nprefill attention (causal chunk over a cached prefix)")
    print(f"{'prefix':>6} {'chunk':>5} | {'torch ref ms':>12} {'SDPA ms':>8} {'mojo ms':>8} | {'vs ref':>6} "
          f"{'vs SDPA':>7}")
    for prefix, chunk in ((0, 128), (0, 512), (1024, 256), (0, 2048)):
        ctx = prefix + chunk
        k_cache, v_cache, plan, ref_plan, query, _ = batch([(ctx, chunk)], rng)
        q = query.transpose(0, 1).unsqueeze(0)  # [1, heads, chunk, dim]
        k = torch.randn(1, KV_HEADS, ctx, HEAD_DIM).to(DTYPE)
        v = torch.randn(1, KV_HEADS, ctx, HEAD_DIM).to(DTYPE)
        mask = torch.arange(ctx).view(1, -1) <= torch.arange(prefix, ctx).view(-1, 1)
        t_ref = timed(lambda: reference.paged_attention(query, k_cache, v_cache, ref_plan, scale))
        t_sdpa = timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True))
        t_mojo = timed(lambda: mojo_attention.paged_attention(module, query, k_cache, v_cache, plan, scale,
                                                        threading="omp"))
        print(f"{prefix:>6} {chunk:>5} | {t_ref * 1e3:>12.2f} {t_sdpa * 1e3:>8.2f} {t_mojo * 1e3:>8.2f} | "
              f"{t_ref / t_mojo:>5.1f}x {t_sdpa / t_mojo:>6.2f}x")

    print("\nKV write (scatter new rows into the cache)")
    print(f"{'tokens':>6} | {'torch ref us':>12} {'mojo us':>8} {'speedup':>7}")
    for tokens in (1, 32, 512):
        k_cache, v_cache, plan, _, _, slots = batch([(tokens, tokens)], rng)
        key = torch.randn(tokens, KV_HEADS, HEAD_DIM).to(DTYPE)
        value = torch.randn(tokens, KV_HEADS, HEAD_DIM).to(DTYPE)
        t_ref = timed(lambda: reference.write_kv(k_cache, v_cache, key, value, slots))
        t_mojo = timed(lambda: mojo_attention.write_kv(module, k_cache, v_cache, key, value, plan))
        print(f"{tokens:>6} | {t_ref * 1e6:>12.1f} {t_mojo * 1e6:>8.1f} {t_ref / t_mojo:>6.1f}x")


if __name__ == "__main__":
    main()

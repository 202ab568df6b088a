"""Attention alone on the GPU: MILI's GPU module (Modular's flash attention) against the torch reference.

`python -m loadtest.gpu.bench_attention` (run by `make gpu-check`): for a model shape (default Qwen3-0.6B's: 16
query heads, 8 KV heads, head_dim 128; bf16, 16-token pages scattered over the cache), decode batches of 1, 32 and
128 rows at contexts 128, 1k and 4k, and single prefills of 1k and 4k tokens. Each case times both backends'
attention call with CUDA events (after warm-up; the plan is built once, as a step does), checks that they agree,
times the module once more without its shared-memory zeroing (what the fill costs), and reports the achieved
bandwidth (K and V read once, query read and output written) against the device's measured copy bandwidth (a 1 GiB
device-to-device copy, read + write). JSON goes to --out; the table is printed.

`--dry-run` lists the cases and writes the JSON without running anything (what a machine without CUDA can do).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from kernels.builder.gpu_modules import PAGE_SIZE, GpuShape

DECODE = [(batch, context) for batch in (1, 32, 128) for context in (128, 1024, 4096)]
PREFILL = [1024, 4096]
WARMUP, ITERS = 3, 20


def cases() -> list[dict]:
    """Each case: its kind and (context length, query length) per sequence."""
    out = [{"kind": "decode", "batch": b, "context": c, "seqs": [(c, 1)] * b} for b, c in DECODE]
    return out + [{"kind": "prefill", "batch": 1, "context": c, "seqs": [(c, c)]} for c in PREFILL]


def time_ms(fn, warmup: int = WARMUP, iters: int = ITERS) -> float:
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def copy_bandwidth_gbs(device: torch.device, nbytes: int = 1 << 30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), warmup=2, iters=10)
    return 2 * nbytes / (ms / 1e3) / 1e9


def random_step(shape: GpuShape, seqs, device: torch.device, gen: torch.Generator):
    """Caches with every sequence's pages scattered, the query, and the step's metadata (MILI's form)."""
    from worker.attention.cuda import scattered_pages
    from worker.attention.metadata import AttentionMetadata

    tables, slots, num_blocks = scattered_pages(seqs, gen, spare_blocks=1)
    cache_shape = (num_blocks, PAGE_SIZE, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.randn(cache_shape, device=device, dtype=torch.bfloat16)
    v_cache = torch.randn(cache_shape, device=device, dtype=torch.bfloat16)
    tokens = sum(q for _, q in seqs)
    query = torch.randn(tokens, shape.num_heads, shape.head_dim, device=device, dtype=torch.bfloat16)
    starts = [0]
    for _, q in seqs:
        starts.append(starts[-1] + q)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64).to(device), block_tables=tables.to(device),
        context_lens=torch.tensor([c for c, _ in seqs], dtype=torch.int32).to(device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32).to(device),
        context_lens_host=tuple(c for c, _ in seqs), query_lens_host=tuple(q for _, q in seqs), block_size=PAGE_SIZE)
    return k_cache, v_cache, query, meta


def bytes_moved(shape: GpuShape, seqs) -> int:
    kv = sum(c for c, _ in seqs) * shape.num_kv_heads * shape.head_dim * 2 * 2  # K and V, bf16
    q_and_out = sum(q for _, q in seqs) * shape.num_heads * shape.head_dim * 2 * 2
    return kv + q_and_out


def run(shape: GpuShape, device: torch.device, seed: int) -> dict:
    from worker.attention.cuda import MojoCudaAttentionBackend
    from worker.attention.torch_backend import TorchAttentionBackend

    torch_backend = TorchAttentionBackend()
    try:
        mojo = MojoCudaAttentionBackend(shape, torch.bfloat16, PAGE_SIZE, device)
        mojo_error = None
    except Exception as e:
        mojo, mojo_error = None, f"{type(e).__name__}: {e}"
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    copy_gbs = copy_bandwidth_gbs(device)
    rows = []
    for case in cases():
        k_cache, v_cache, query, meta = random_step(shape, case["seqs"], device, gen)
        scale = shape.head_dim ** -0.5
        ref_plan = torch_backend.plan(meta)
        row = {k: case[k] for k in ("kind", "batch", "context")}
        row["torch_ms"] = time_ms(lambda: torch_backend.attend(query, k_cache, v_cache, meta, ref_plan, scale))
        moved = bytes_moved(shape, case["seqs"])
        row["torch_gbs"] = moved / (row["torch_ms"] / 1e3) / 1e9
        if mojo is not None:
            try:
                plan = mojo.plan(meta)
                row["mojo_ms"] = time_ms(lambda: mojo.attend(query, k_cache, v_cache, meta, plan, scale))
                row["mojo_gbs"] = moved / (row["mojo_ms"] / 1e3) / 1e9
                row["mojo_fraction_of_copy"] = row["mojo_gbs"] / copy_gbs
                row["speedup"] = row["torch_ms"] / row["mojo_ms"]
                # What zeroing shared memory first costs (kernels/gpu_attention.mojo, SHARED_MEMORY_FILL): the same
                # call without it (timed only; its output may hold NaN, which is why the fill is there).
                row["mojo_without_fill_ms"] = time_ms(lambda: mojo.ops.paged_attention(
                    query, k_cache, v_cache, plan, scale, zero_shared_memory=False))
                got = mojo.attend(query, k_cache, v_cache, meta, plan, scale).float()
                want = torch_backend.attend(query.float(), k_cache.float(), v_cache.float(), meta, ref_plan, scale)
                row["max_rel_error"] = ((got - want).abs().max() / want.abs().max()).item()
            except Exception as e:
                row["mojo_error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
    return {"device": torch.cuda.get_device_name(device), "shape": str(shape), "dtype": "bfloat16",
            "page_size": PAGE_SIZE, "copy_bandwidth_gbs": copy_gbs, "mojo_error": mojo_error, "rows": rows}


def table(report: dict) -> str:
    lines = [f"attention on {report['device']}, {report['shape']} bf16; device copy bandwidth "
             f"{report['copy_bandwidth_gbs']:.0f} GB/s" + (f"; mojo unavailable: {report['mojo_error']}"
                                                             if report["mojo_error"] else ""),
             f"{'case':<22} {'torch ms':>9} {'mojo ms':>9} {'no fill':>9} {'speedup':>8} {'mojo GB/s':>10} "
             f"{'of copy':>8} {'rel err':>8}"]
    for r in report["rows"]:
        case = f"{r['kind']} b{r['batch']} ctx{r['context']}"

        def f(key, fmt):
            return format(r[key], fmt) if key in r else "-"

        lines.append(f"{case:<22} {f('torch_ms', '9.3f')} {f('mojo_ms', '9.3f')} {f('mojo_without_fill_ms', '9.3f')} "
                     f"{f('speedup', '8.2f')} "
                     f"{f('mojo_gbs', '10.0f')} {f('mojo_fraction_of_copy', '8.2f')} {f('max_rel_error', '8.1e')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.gpu.bench_attention", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="16,8,128", help="query heads, KV heads, head_dim (default Qwen3-0.6B's)")
    parser.add_argument("--out", type=Path, default=Path("build/gpu-check/gpu_attention.json"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true", help="list the cases, write the JSON, run nothing")
    args = parser.parse_args(argv)
    shape = GpuShape(*map(int, args.shape.split(",")))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.dry_run or not torch.cuda.is_available():
        reason = "dry run" if args.dry_run else "no CUDA device"
        listed = [{k: c[k] for k in ("kind", "batch", "context")} for c in cases()]
        args.out.write_text(json.dumps({"skipped": reason, "shape": str(shape), "cases": listed}, indent=2) + "\n")
        print(f"attention benchmark not run ({reason}); {len(listed)} cases for {shape}: "
              + ", ".join(f"{c['kind']} b{c['batch']} ctx{c['context']}" for c in listed))
        return 0 if args.dry_run else 1
    report = run(shape, torch.device("cuda"), args.seed)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    return 0 if report["mojo_error"] is None and not any("mojo_error" in r for r in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())

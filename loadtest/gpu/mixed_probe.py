"""Why steps mixing sequences go wrong in the GPU attention module, where each kernel alone in a fresh process is right.

    python -m loadtest.gpu.mixed_probe [--bundle .gpu-bundle] [--out mixed_probe.json] [--trials 12]

loadtest/gpu/diagnose.py runs every case in a process of its own and every case passes there; the module's tests,
which run many steps in one process, and the engine fail on steps mixing decode rows and prefill chunks. What differs
is what the process did before: freed device memory holds the NaNs earlier steps wrote. So here, in one process,
random mixed steps run with the caching allocator's free blocks filled with NaN before each, in variants that each
change one thing the kernels could read or write outside what MILI hands them:
- plain: as a step runs (KV write, attention, no wait), outputs poisoned with NaN;
- one-partition: plain, with Modular's split-K forced to one partition;
- old-metadata: plain, with the decode dispatch metadata passed for steps with prefill rows too (as it was);
- synced: the device synchronised after the write and after the attention;
- out-zero: outputs start as zeros: rows that stay exactly zero were never written;
- q-tail-nan / q-tail-zero: the queries followed by 256 rows of NaN (or zeros) in the same buffer;
- kv-tail-nan: the caches followed by 8 NaN blocks the module is not told of;
- meta-tail-junk: cache lengths, row offsets and block tables followed by junk entries;
- zero-margins / nan-margins: every tensor the module reads or writes (queries, caches, block tables, lengths, row
  offsets, outputs) copied into a buffer with 64 KiB of zeros (or NaN, and junk block ids) before and after it;
- smem-zero / smem-nan: every SM's shared memory filled with zeros (or NaN) by a kernel of the module's just before
  the attention, on its stream;
- clean: no NaN put in free memory first.
Each variant reports its failures and, for failing steps, which rows went wrong (their sequence's query and context
lengths, NaN or finite). Run where `make gpu-check` runs: with --bundle it installs the carried wheels and runtime
(as gpu-check does) and reruns itself with their environment.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("plain", "one-partition", "old-metadata", "synced", "out-zero", "q-tail-nan", "q-tail-zero", "kv-tail-nan", "meta-tail-junk", "clean")
FIXED = [[(2000, 1), (1100, 1100), (3, 1)], [(15, 1), (16, 1), (17, 1), (40, 7), (33, 33)],
         [(17, 1), (200, 1), (1030, 1)], [(3, 1), (2000, 1), (40, 1)]]
TOLERANCE = 1e-2


def random_seqs(rng: random.Random) -> list[tuple[int, int]]:
    """Decode rows beside prefill chunks over cached prefixes, as the module's ragged-batch test draws them."""
    seqs = [(rng.randint(1, 1400), 1) for _ in range(rng.randint(1, 10))]
    for _ in range(rng.randint(1, 4)):
        prefix = rng.choice([0, 16, 32, rng.randint(1, 1200)])
        chunk = rng.choice([16, 17, rng.randint(2, 300)])
        seqs.append((prefix + chunk, chunk))
    rng.shuffle(seqs)
    return seqs


def fill_free_memory_with_nan(device) -> None:
    """Allocates and frees NaN tensors of many sizes, so the caching allocator's free blocks (small and large
    pools) hold NaN, as after a step that wrote NaN."""
    import torch

    junk = [torch.full((n,), float("nan"), dtype=torch.bfloat16, device=device)
            for n in [1 << k for k in range(7, 20)] for _ in range(8)]
    junk += [torch.full((n,), float("nan"), dtype=torch.bfloat16, device=device) for n in (1 << 21, 1 << 23, 1 << 25)]
    del junk


def padded_copy(t, extra_rows: int, fill):
    """t's values at the start of a buffer `extra_rows` rows longer, the rest `fill`; returns the view of t's rows."""
    import torch

    buf = torch.full((t.shape[0] + extra_rows, *t.shape[1:]), fill, dtype=t.dtype, device=t.device)
    buf[: t.shape[0]] = t
    return buf[: t.shape[0]]


def in_margins(t, fill, margin_bytes: int = 1 << 16):
    """A copy of t in the middle of a buffer with `margin_bytes` of `fill` on either side."""
    import torch

    pad = margin_bytes // t.element_size()
    buf = torch.full((2 * pad + t.numel(),), fill, dtype=t.dtype, device=t.device)
    view = buf[pad:pad + t.numel()].view(t.shape)
    view.copy_(t)
    return view


def one_step(ops, seqs, seed: int, variant: str) -> dict:
    import dataclasses

    import torch

    from worker.attention.cuda import RandomStep

    device = ops.device
    if variant == "clean":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    else:
        fill_free_memory_with_nan(device)
    step = RandomStep.draw(ops.shape, seqs, seed, device)
    ref_k, ref_v = step.reference_caches()
    expected = step.expected(ref_k, ref_v)
    k_cache, v_cache, query, plan = step.k_cache, step.v_cache, step.query, step.plan
    if variant == "kv-tail-nan":
        k_cache, v_cache = (padded_copy(c, 8, float("nan")) for c in (k_cache, v_cache))
    if variant.startswith("q-tail"):
        query = padded_copy(query, 256, float("nan") if variant == "q-tail-nan" else 0.0)
    if variant == "meta-tail-junk":
        junk = 0x3FFFFFFF
        plan = dataclasses.replace(plan, cache_lengths=padded_copy(plan.cache_lengths, 64, junk),
                                   row_offsets=padded_copy(plan.row_offsets, 64, junk),
                                   block_tables=padded_copy(plan.block_tables, 64, junk))
    if variant.endswith("-margins"):
        nan = variant == "nan-margins"
        k_cache, v_cache, query = (in_margins(t, float("nan") if nan else 0.0) for t in (k_cache, v_cache, query))
        plan = dataclasses.replace(plan, **{name: in_margins(getattr(plan, name), 0x7FC07FC0 if nan else 0)
                                            for name in ("block_tables", "cache_lengths", "row_offsets")})
    for cache in (k_cache, v_cache):  # the new K/V poisoned until the module's write
        cache.view(-1, *cache.shape[2:])[step.slot_mapping] = float("nan")
    torch.cuda.synchronize(device)
    ops.write_kv(k_cache, v_cache, step.key, step.value, plan)
    if variant == "synced":
        torch.cuda.synchronize(device)
    out = torch.full_like(query, 0.0 if variant == "out-zero" else float("nan"))
    if variant.endswith("-margins"):
        out = in_margins(out, float("nan") if variant == "nan-margins" else 0.0)
    ops.paged_attention(query, k_cache, v_cache, plan, step.scale, out=out,
                        metadata_for_every_step=variant == "old-metadata",
                        partitions=1 if variant == "one-partition" else 0,
                        fill_shared={"smem-zero": 1, "smem-nan": 2}.get(variant, 0))
    if variant == "synced":
        torch.cuda.synchronize(device)
    got = out.float().clone()
    torch.cuda.synchronize(device)
    scale = expected.abs().max().clamp_min(1e-6)
    row_error = ((got - expected).abs().flatten(1).amax(1) / scale).nan_to_num(float("inf"))
    bad = (row_error > TOLERANCE).nonzero().flatten().tolist()
    owner, starts = [], [0]
    for i, (_, q) in enumerate(seqs):
        owner += [i] * q
        starts.append(starts[-1] + q)
    rows = []
    for r in bad[:40]:
        i = owner[r]
        rows.append({"row": r, "seq": i, "ctx": seqs[i][0], "q_len": seqs[i][1], "local_row": r - starts[i],
                     "nan": bool(not torch.isfinite(got[r]).all()), "zero": bool((got[r] == 0).all()),
                     "error": round(float(row_error[r]), 4)})
    return {"seqs": seqs, "seed": seed, "ok": not bad, "bad_rows": len(bad), "rows": rows,
            "bad_seqs": sorted({owner[r] for r in bad}), "max_error": float(row_error.max())}


def probe(shapes: list[str], trials: int, seed: int, variants: tuple[str, ...] = VARIANTS) -> dict:
    import torch

    from kernels.builder.gpu_modules import GpuShape
    from kernels.gpu_attention import open_attention

    device = torch.device("cuda", 0)
    report = {}
    for text in shapes:
        ops = open_attention(GpuShape(*map(int, text.split("/"))), device)
        rng = random.Random(seed)
        steps = FIXED + [random_seqs(rng) for _ in range(trials)]
        for variant in variants:
            results = []
            for n, seqs in enumerate(steps):
                try:
                    results.append(one_step(ops, seqs, seed + n, variant))
                except Exception as e:  # a device fault is sticky: the rest of the process would fail too
                    results.append({"seqs": seqs, "ok": False, "error": f"{type(e).__name__}: {e}"[:500]})
                    report[f"{text} {variant}"] = {"failed": sum(not r["ok"] for r in results),
                                                   "steps": len(results), "results": results}
                    return report
            failed = [r for r in results if not r["ok"]]
            report[f"{text} {variant}"] = {"failed": len(failed), "steps": len(results), "failures": failed[:6]}
            print(f"{text:>10} {variant:<15} {len(failed)}/{len(results)} steps wrong", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.gpu.mixed_probe", description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, help="install this carried bundle and rerun with its environment")
    ap.add_argument("--shapes", default="4/2/64,16/8/128")
    ap.add_argument("--trials", type=int, default=12, help="random mixed steps per variant (besides four fixed ones)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "build" / "gpu-check")
                    / "mixed_probe.json")
    args = ap.parse_args(argv)
    if args.bundle is not None:
        from loadtest.gpu import check, runtime

        check.install(args.bundle)
        env = check.suite_env(args.bundle, dry_run=False) | runtime.device_env(args.bundle)
        rest = [a for a in (argv if argv is not None else sys.argv[1:])]
        i = rest.index("--bundle")
        del rest[i:i + 2]
        return subprocess.run([sys.executable, "-m", "loadtest.gpu.mixed_probe", *rest], cwd=ROOT, env=env).returncode
    report = probe(args.shapes.split(","), args.trials, args.seed, tuple(args.variants.split(",")))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(v["failed"] == 0 for v in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

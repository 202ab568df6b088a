"""Steps mixing sequences through the GPU attention module, many in one process, against the torch reference.

    python -m loadtest.gpu.mixed_probe [--bundle .gpu-bundle] [--out mixed_probe.json] [--trials 12] [--variants ...]

loadtest/gpu/diagnose.py runs every case in a process of its own, and there every case passed; the module's tests and
the engine, which run many steps in one process, failed on steps mixing decode rows and prefill chunks. This probe
found why (an H200, 2026-11-27, loadtest/results/gpu_mixed_probe.md): Modular's attention kernels compute over
shared memory they never load for the keys past a sequence's end. Those keys get zero weight, but a NaN or infinity
an earlier kernel left there survives it, so a short sequence's rows (fewer keys than a tile) came out NaN. Without
the module's zeroing, 9 to 11 of 12 random steps went wrong here, in every variant that changed what the module
reads around its inputs; with every SM's shared memory zeroed just before the attention, none did.

Before each step the caching allocator's free blocks are filled with NaN (as after steps that wrote NaN); then:
- plain: as a step runs (KV write, attention, no wait), outputs poisoned with NaN, the module zeroing shared memory;
- no-zeroing: the same without the zeroing (the module as it was);
- smem-nan / smem-nan-no-zeroing: NaN put in every SM's shared memory just before the attention, with and without;
- synced: the device synchronised after the write and after the attention;
- out-zero: outputs start as zeros: rows that stay exactly zero were never written;
- nan-margins: every tensor the module reads or writes (queries, caches, block tables, lengths, row offsets, outputs)
  copied into a buffer with 64 KiB of NaN (and junk block ids) before and after it;
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
VARIANTS = ("plain", "no-zeroing", "smem-nan", "smem-nan-no-zeroing", "synced", "out-zero", "nan-margins", "clean")
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

    from kernels.gpu_attention import NAN_BITS
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
    if variant == "nan-margins":
        k_cache, v_cache, query = (in_margins(t, float("nan")) for t in (k_cache, v_cache, query))
        plan = dataclasses.replace(plan, **{name: in_margins(getattr(plan, name), NAN_BITS)
                                            for name in ("block_tables", "cache_lengths", "row_offsets")})
    for cache in (k_cache, v_cache):  # the new K/V poisoned until the module's write
        cache.view(-1, *cache.shape[2:])[step.slot_mapping] = float("nan")
    torch.cuda.synchronize(device)
    ops.write_kv(k_cache, v_cache, step.key, step.value, plan)
    if variant == "synced":
        torch.cuda.synchronize(device)
    out = torch.full_like(query, 0.0 if variant == "out-zero" else float("nan"))
    if variant == "nan-margins":
        out = in_margins(out, float("nan"))
    if variant.startswith("smem-nan"):
        ops.fill_shared_memory(NAN_BITS)
    ops.paged_attention(query, k_cache, v_cache, plan, step.scale, out=out,
                        zero_shared_memory=not variant.endswith("no-zeroing"))
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

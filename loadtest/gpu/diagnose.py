"""Which of the GPU attention module's kernels faults, and where: each kernel alone, in a process of its own.

    python -m loadtest.gpu.diagnose [--out diagnose.json] [--shapes 4/2/64,16/8/128] [--sanitizer]

A device fault (an illegal or misaligned address) is sticky: every later CUDA call of that process fails, so one
faulting kernel makes a whole suite fail after it and hides which kernel it was. Here each case runs in a child
process: the KV write alone (checked against the reference write), and the attention for decode rows only, one
whole prompt, a prefill chunk over a cached prefix and two steps mixing sequences (checked against the reference
attention), each twice: over caches the reference wrote with the device synchronised after the call ("synced"), and
as a step runs it, the module's write then its attention with no wait and the result read on torch's stream
("streamed"), several seeds each. With --sanitizer a faulting case runs again under compute-sanitizer's memcheck,
which names the kernel and the access. Run where `make gpu-check` runs (it needs the carried module and CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# (context length, query length) per sequence, by case.
STEPS = {
    "decode": ((15, 1), (16, 1), (17, 1), (300, 1)),
    "prompt": ((33, 33),),
    "chunk": ((40, 7),),
    "mixed": ((15, 1), (16, 1), (17, 1), (40, 7), (33, 33)),
    "mixed-long": ((2000, 1), (1100, 1100), (3, 1)),
}
# "synced": the device is synchronised after every call, so only the kernels themselves can be wrong. "streamed": as
# a step runs, the module's KV write then its attention with no wait between, the result read by torch on its
# stream before the one final synchronisation; where "synced" passes and "streamed" fails, the streams' ordering is.
MODES = ("synced", "streamed")
CASES = ("write_kv",) + tuple(f"attention:{name}:{mode}" for name in STEPS for mode in MODES)


def run_case(case: str, shape_text: str, seed: int = 0) -> dict:
    """In the child: one kernel, one step, synchronised; what it did against the reference."""
    import torch

    from kernels.builder.gpu_modules import GpuShape
    from kernels.gpu_attention import open_attention
    from worker.attention.cuda import RandomStep

    shape = GpuShape(*map(int, shape_text.split("/")))
    device = torch.device("cuda", 0)
    ops = open_attention(shape, device)
    seqs = STEPS["mixed" if case == "write_kv" else case.split(":")[1]]
    mode = "synced" if case == "write_kv" else case.split(":")[2]
    step = RandomStep.draw(shape, seqs, seed, device)
    k_cache, v_cache, query, plan, slot_mapping = step.k_cache, step.v_cache, step.query, step.plan, step.slot_mapping
    ref_k, ref_v = step.reference_caches()
    result = {"case": case, "shape": shape_text}
    if case == "write_kv":
        ops.write_kv(k_cache, v_cache, step.key, step.value, plan)
        torch.cuda.synchronize(device)
        result["cache_equal"] = bool(torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v))
        result["ok"] = result["cache_equal"]
        return result
    scale = step.scale
    if mode == "synced":
        out = ops.paged_attention(query, ref_k, ref_v, plan, scale, out=torch.full_like(query, float("nan")))
        torch.cuda.synchronize(device)
    else:  # the new K/V poisoned, then written by the module, attended at once; read on torch's stream
        for cache in (k_cache, v_cache):
            cache.view(-1, *cache.shape[2:])[slot_mapping] = float("nan")
        ops.write_kv(k_cache, v_cache, step.key, step.value, plan)
        out = ops.paged_attention(query, k_cache, v_cache, plan, scale, out=torch.full_like(query, float("nan")))
        out = out.clone()
        torch.cuda.synchronize(device)
        result["cache_equal"] = bool(torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v))
    expected = step.expected(ref_k, ref_v)
    result["finite"] = bool(torch.isfinite(out).all())
    result["relative_error"] = ((out.float() - expected.float()).abs().max()
                                / expected.float().abs().max().clamp_min(1e-6)).item()
    result["nan_rows"] = int((~torch.isfinite(out)).flatten(1).any(1).sum())
    result["ok"] = result["finite"] and result["relative_error"] <= 1e-2 and result.get("cache_equal", True)
    return result


def sanitizer() -> str | None:
    return shutil.which("compute-sanitizer") or next(
        (str(p) for p in (Path("/usr/local/cuda/bin/compute-sanitizer"),) if p.exists()), None)


def child(case: str, shape: str, timeout: float, wrap: list[str] | None = None, seed: int = 0) -> dict:
    """The case's result from a child process; under a wrapper (the sanitizer), the tail of all it printed."""
    cmd = [*(wrap or []), sys.executable, "-m", "loadtest.gpu.diagnose", "--child", case, "--shapes", shape,
           "--seed", str(seed)]
    try:
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return {"case": case, "shape": shape, "ok": False, "error": f"timeout after {timeout:.0f} s",
                "output": str(e.stdout or "")[-3000:]}
    if wrap:
        return {"output": (run.stdout + "\n" + run.stderr)[-6000:]}
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode == 0 and lines:
        return json.loads(lines[-1])
    return {"case": case, "shape": shape, "ok": False, "returncode": run.returncode,
            "error": (run.stderr + "\n" + run.stdout)[-4000:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.gpu.diagnose", description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4/2/64,16/8/128", help="query heads/KV heads/head_dim, comma-separated")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "build" / "gpu-check")
                    / "diagnose.json")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per case")
    ap.add_argument("--sanitizer", action="store_true", help="rerun faulting cases under compute-sanitizer memcheck")
    ap.add_argument("--repeats", type=int, default=3, help="seeds per case (the mixed-step failures were intermittent)")
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        try:
            print(json.dumps(run_case(args.child, args.shapes, args.seed)), flush=True)
        except Exception as e:
            print(json.dumps({"case": args.child, "shape": args.shapes, "ok": False,
                              "error": f"{type(e).__name__}: {e}"[:3000]}), flush=True)
        return 0
    jobs = [(case, shape, seed) for shape in args.shapes.split(",") for case in CASES for seed in range(args.repeats)]
    with ThreadPoolExecutor(max_workers=min(len(jobs), 12)) as pool:
        results = list(pool.map(lambda job: child(job[0], job[1], args.timeout, seed=job[2]) | {"seed": job[2]},
                                jobs))
    tool = sanitizer() if args.sanitizer else None
    faulted = [r for r in results if not r["ok"]]
    if tool and faulted:
        wrap = [tool, "--tool", "memcheck", "--print-limit", "8", "--show-backtrace", "device"]
        with ThreadPoolExecutor(max_workers=len(faulted)) as pool:
            memchecks = list(pool.map(lambda r: child(r["case"], r["shape"], 2 * args.timeout, wrap, r["seed"]),
                                      faulted))
        for r, m in zip(faulted, memchecks):
            r["memcheck"] = m.get("output") or m.get("error")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"sanitizer": tool, "results": results}, indent=2) + "\n")
    for r in results:
        detail = "ok" if r["ok"] else (r.get("error") or json.dumps(r))[-600:]
        print(f"{r['shape']:>10} {r['case']:<28} seed {r['seed']} {detail}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""MILI's engine on a GPU against transformers `generate` on the same GPU, in one process, on one checkpoint.

    python -m loadtest.gpu.bench_engine [--out gpu.json] [--markdown gpu.md] [--budget-s 420]   # needs CUDA
    python -m loadtest.gpu.bench_engine --tiny        # a two-layer Qwen3, everything on the CPU, in seconds (CI runs it)
    python -m loadtest.gpu.bench_engine --dry-run     # prints the plan and writes it as the JSON; runs nothing

A Qwen3-0.6B-shaped checkpoint with random weights (bf16, drawn on the GPU, seed fixed) is written to a temporary
folder. MILI's engine (LLMEngine) serves it with the sizes in GPU_SETTINGS and is warmed up first (one short request
and one short batch: CUDA context, first kernels and any lazily captured graphs are not timed). Measured, in this
order: single-stream decode tokens/s at contexts 128 and 1k (timed from the first token, the prefill excluded),
time to first token of a 1k-token prompt (median of 5, engine idle), offline throughput as nano-vllm's bench.py
(256 sequences, prompt and output lengths uniform in 100..1024, seeded, all added at once, greedy with
ignore_eos), a torch.profiler profile of one decode step at batch 1 and 64 (loadtest/decode_profile.py). Last,
transformers `generate` (bf16, sdpa attention, dynamic KV cache unless --hf-cache static) on the same prompts:
single stream, and offline over a fixed subset in left-padded batches. Every part is skipped ("skipped: budget")
when the budget has too little left for it, and the long loops stop at the budget; the JSON is rewritten after each
part.
Nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from loadtest import decode_profile
from loadtest.fixtures.random_checkpoint import QWEN3_0_6B, TINY, build_checkpoint
from loadtest.gpu import engine_timing, transformers_generate
from loadtest.machine import device_name


@dataclass(frozen=True)
class Settings:
    model: dict
    dtype: str
    contexts: tuple[int, ...]  # single-stream prompt lengths
    single_output: int  # tokens each single-stream request decodes
    ttft_prompt: int
    ttft_runs: int
    offline_sequences: int
    offline_lengths: tuple[int, int]  # prompt and output lengths uniform in this range
    kv_cache_memory: int  # bytes
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    hf_requests: int  # the first this many offline requests go to transformers
    hf_batch: int
    profile_batches: tuple[int, ...]
    profile_context: int
    profile_steps: int
    budget_s: float
    # Rough seconds each part needs on the device (checked against what the budget has left before it starts).
    needs_s: dict = field(default_factory=dict)


# An H100 (80 GB): 32 GiB of KV cache hold 299k tokens (28 layers x 8 KV heads x 128 x K,V x bf16 = 112 KiB a token),
# the offline run's 256 sequences at their full lengths (288k tokens at most) with room to spare; the rest is for
# transformers' batches, which run in the same process. (On a GPU with less memory: 45% of it.)
GPU_SETTINGS = Settings(
    model=QWEN3_0_6B, dtype="bfloat16", contexts=(128, 1024), single_output=256, ttft_prompt=1024, ttft_runs=5,
    offline_sequences=256, offline_lengths=(100, 1024), kv_cache_memory=32 << 30, max_num_seqs=256,
    max_num_batched_tokens=16384, max_model_len=4096, hf_requests=64, hf_batch=64,
    profile_batches=(1, 64), profile_context=512, profile_steps=10, budget_s=420.0,
    needs_s={"single_stream": 20, "ttft": 5, "offline": 60, "transformers": 45, "profile": 25})
TINY_SETTINGS = Settings(
    model=TINY, dtype="float32", contexts=(16, 64), single_output=16, ttft_prompt=64, ttft_runs=3,
    offline_sequences=16, offline_lengths=(8, 32), kv_cache_memory=16 << 20, max_num_seqs=256,
    max_num_batched_tokens=256, max_model_len=256, hf_requests=8, hf_batch=4,
    profile_batches=(1, 8), profile_context=32, profile_steps=4, budget_s=120.0,
    needs_s={"single_stream": 1, "ttft": 1, "offline": 1, "transformers": 1, "profile": 1})


class Budget:
    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()

    def deadline(self, keep: float = 0.0) -> float:
        """A deadline that keeps `keep` seconds for later parts (never less than a fifth of what is left)."""
        return self.end - min(keep, 0.8 * max(self.left(), 0.0))


def engine_config(args, s: Settings, model_dir: Path, device: torch.device):
    from shared.config import EngineConfig

    extra = {} if args.enforce_eager is None else {"enforce_eager": args.enforce_eager}
    if args.compile_layer_ops is not None:
        extra["compile_layer_ops"] = args.compile_layer_ops
    return EngineConfig(model=str(model_dir), device=str(device), dtype=s.dtype, attention_backend=args.attention_backend,
                        kv_cache_memory=s.kv_cache_memory, max_num_seqs=s.max_num_seqs,
                        max_num_batched_tokens=s.max_num_batched_tokens, max_model_len=s.max_model_len, **extra)


class Run:
    """Runs the parts in order, each skipped when the budget is short, an error recorded rather than raised; the
    report is written after each part."""

    def __init__(self, report: dict, budget: Budget, s: Settings, write):
        self.report, self.budget, self.s, self.write = report, budget, s, write
        self.errors: list[str] = []

    def part(self, name: str, fn):
        needs = self.s.needs_s.get(name, 0)
        if self.budget.left() < needs:
            result = {"skipped": f"budget: {max(self.budget.left(), 0):.0f} s left, the part needs about {needs} s"}
        else:
            start = time.perf_counter()
            try:
                result = fn()
            except Exception as e:
                traceback.print_exc()
                self.errors.append(name)
                result = {"error": f"{type(e).__name__}: {e}"}
            result["part_seconds"] = time.perf_counter() - start
        print(f"[{name}] {json.dumps(result)[:400]}", flush=True)
        self.report["parts"][name] = result
        self.write()
        return result


def mili_parts(run: Run, engine, vocab: int, seed: int, skip: set[str]) -> None:
    s, budget = run.s, run.budget
    rng = random.Random(seed + 1)
    later = sum(s.needs_s.get(name, 0) for name in ("transformers", "profile") if name not in skip)  # run after these

    def single():
        return {str(c): engine_timing.single_stream(engine, engine_timing.random_prompt(c, vocab, rng),
                                                    s.single_output, budget.deadline(later)) for c in s.contexts}

    def ttft():
        prompts = [engine_timing.random_prompt(s.ttft_prompt, vocab, rng) for _ in range(s.ttft_runs)]
        return engine_timing.time_to_first_token(engine, prompts, budget.deadline(later))

    def offline():
        lo, hi = s.offline_lengths
        workload = engine_timing.offline_workload(s.offline_sequences, lo, hi, vocab, seed)
        return engine_timing.offline(engine, workload, budget.deadline(later))

    run.part("single_stream", single)
    run.part("ttft", ttft)
    run.part("offline", offline)


def transformers_part(run: Run, model_dir: Path, device: torch.device, vocab: int, seed: int, args) -> dict:
    s, budget = run.s, run.budget
    dtype = getattr(torch, s.dtype)
    model = transformers_generate.load(model_dir, device, dtype, args.hf_attention)
    try:
        transformers_generate.warm_up(model, device, args.hf_cache)
        rng = random.Random(seed + 1)  # the same prompts MILI's single streams decoded
        single = {str(c): transformers_generate.single_stream(model, engine_timing.random_prompt(c, vocab, rng),
                                                              s.single_output, device, args.hf_cache)
                  for c in s.contexts}
        lo, hi = s.offline_lengths
        workload = engine_timing.offline_workload(s.offline_sequences, lo, hi, vocab, seed)
        n = min(s.hf_requests, s.offline_sequences)
        subset = f"the first {n} of the {s.offline_sequences} offline requests, in order, batches of {s.hf_batch}"
        print(f"transformers offline: {subset}", flush=True)
        offline = transformers_generate.offline(model, workload.prompts[:n], workload.output_lens[:n], s.hf_batch,
                                                device, args.hf_cache, budget.deadline())
        offline["subset"] = subset
    finally:
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"single_stream": single, "offline": offline, "attention": args.hf_attention, "cache": args.hf_cache,
            "dtype": s.dtype, "decoding": "greedy, EOS suppressed to each batch's longest output (min_new_tokens)"}


def profile_part(engine, s: Settings, vocab: int, seed: int) -> dict:
    rng = random.Random(seed + 2)
    rows = [decode_profile.profile_decode(engine, [engine_timing.random_prompt(s.profile_context, vocab, rng)
                                                   for _ in range(b)], s.profile_steps) for b in s.profile_batches]
    return {"rows": rows}


def headline(report: dict) -> None:
    """The top-level fields (None where a part did not run)."""
    parts = report["parts"]

    def get(part, *keys):
        value = parts.get(part)
        for k in keys:
            value = value.get(k) if isinstance(value, dict) else None
        return value

    report["single_stream_tok_s"] = {c: get("single_stream", c, "tok_s") for c in map(str, report["settings"]["contexts"])}
    report["offline_tok_s"] = get("offline", "output_tok_s")
    report["offline_total_tok_s"] = get("offline", "total_tok_s")
    report["ttft_1k_ms"] = get("ttft", "median_ms")
    report["transformers_single_stream_tok_s"] = {c: get("transformers", "single_stream", c, "tok_s")
                                                  for c in map(str, report["settings"]["contexts"])}
    report["transformers_offline_tok_s"] = get("transformers", "offline", "output_tok_s")
    mili, hf = report["offline_tok_s"], report["transformers_offline_tok_s"]
    report["ratio_offline_vs_transformers"] = mili / hf if mili and hf else None
    report["profile"] = get("profile", "rows")


def markdown(report: dict) -> str:
    s = report["settings"]

    def num(v, fmt=",.0f"):
        return "-" if v is None else format(v, fmt)

    hf_offline = (report["parts"].get("transformers") or {}).get("offline") or {}
    lines = [f"MILI engine vs transformers generate on {report['device']} ({report['model']}, {s['dtype']}); "
             f"attention backend {report['attention_backend']}; layer ops {report.get('layer_ops', '-')}; decode graphs {report.get('decode_graphs', '-')}; "
             f"torch {report['torch']}, "
             f"transformers {report['transformers']}", "",
             "| measure | MILI | transformers | MILI / transformers |", "|---|---:|---:|---:|"]
    for c in map(str, s["contexts"]):
        m, h = report["single_stream_tok_s"][c], report["transformers_single_stream_tok_s"][c]
        lines.append(f"| single-stream decode tok/s, context {c} | {num(m)} | {num(h)} | "
                     f"{num(m / h if m and h else None, '.2f')} |")
    lines.append(f"| offline output tok/s ({s['offline_sequences']} seqs; transformers: "
                 f"{hf_offline.get('sequences', '-')} in batches of {s['hf_batch']}) | {num(report['offline_tok_s'])} | "
                 f"{num(report['transformers_offline_tok_s'])} | {num(report['ratio_offline_vs_transformers'], '.2f')} |")
    lines.append(f"| offline total tok/s | {num(report['offline_total_tok_s'])} | "
                 f"{num(hf_offline.get('total_tok_s'))} | |")
    runs = (report["parts"].get("ttft") or {}).get("runs", "-")
    lines.append(f"| TTFT, {s['ttft_prompt']}-token prompt, ms (median of {runs}) | {num(report['ttft_1k_ms'], '.1f')} "
                 "| | |")
    hf = report["parts"].get("transformers") or {}
    lines += ["", f"MILI: KV cache {s['kv_cache_memory'] / 2**20:,.0f} MiB, max_num_seqs {s['max_num_seqs']}, "
              f"max_num_batched_tokens {s['max_num_batched_tokens']}, max_model_len {s['max_model_len']}; "
              f"transformers: {hf.get('attention', '-')} attention, {hf.get('cache', '-')} cache. Greedy, ignore_eos, "
              f"{s['single_output']} tokens per single stream; warmed up before timing."]
    if report.get("profile"):
        lines += ["", "```", decode_profile.table(report["profile"]), "```"]
    notes = [f"{k}: {v['skipped'] if 'skipped' in v else v['error']}" for k, v in report["parts"].items()
             if isinstance(v, dict) and ("skipped" in v or "error" in v)]
    for name, part in (("MILI offline", report["parts"].get("offline")), ("transformers offline", hf_offline)):
        if isinstance(part, dict) and part.get("stopped"):
            notes.append(f"{name} did not finish (its figure is over the part that ran): {part['stopped']}")
    if report.get("error"):
        notes.append(f"stopped: {report['error']}")
    return "\n".join(lines + ([""] + notes if notes else []))


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="python -m loadtest.gpu.bench_engine", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("build/gpu-check/gpu.json"))
    ap.add_argument("--markdown", type=Path, help="also write the table here")
    ap.add_argument("--tiny", action="store_true", help="a two-layer Qwen3 on the CPU, small sizes (CI)")
    ap.add_argument("--dry-run", action="store_true", help="print and write the plan, run nothing")
    ap.add_argument("--budget-s", type=float, help="seconds for the whole run (default 420 on a GPU, 120 with --tiny)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attention-backend", choices=("auto", "mojo", "torch"),
                    default=os.environ.get("MILI_ATTENTION_BACKEND", "auto"),
                    help="MILI's attention backend (default $MILI_ATTENTION_BACKEND or auto)")
    ap.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                    help="EngineConfig.enforce_eager: on CUDA, every step eager (no decode graphs)")
    ap.add_argument("--compile-layer-ops", action=argparse.BooleanOptionalAction, default=None,
                    help="EngineConfig.compile_layer_ops: the layers' elementwise operators fused by torch.compile "
                         "(default: the engine's, on for CUDA unless --enforce-eager)")
    ap.add_argument("--hf-cache", choices=("dynamic", "static"), default="dynamic",
                    help="transformers' KV cache (static also makes generate compile the forward)")
    ap.add_argument("--hf-attention", default="sdpa", help="transformers' attn_implementation")
    ap.add_argument("--hf-requests", type=int, help="offline requests transformers runs (the first N; default 64, "
                    "8 with --tiny)")
    ap.add_argument("--hf-batch", type=int, help="transformers' offline batch size (default 64, 4 with --tiny)")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: transformers, profile")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    unknown = set(filter(None, args.skip.split(","))) - {"transformers", "profile"}
    if unknown:
        raise SystemExit(f"--skip: unknown parts {sorted(unknown)}; choose from transformers, profile")
    s = TINY_SETTINGS if args.tiny else GPU_SETTINGS
    overrides = {"budget_s": args.budget_s, "hf_requests": args.hf_requests, "hf_batch": args.hf_batch}
    s = dataclasses.replace(s, **{k: v for k, v in overrides.items() if v is not None})
    if not args.tiny and not args.dry_run and torch.cuda.is_available():
        # On a smaller GPU than an H100 the cache shrinks (preempting more) rather than leave transformers no room.
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        s = dataclasses.replace(s, kv_cache_memory=min(s.kv_cache_memory, int(0.45 * total)))
    budget = Budget(s.budget_s)
    settings = {k: v for k, v in dataclasses.asdict(s).items() if k != "model"}
    report = {"device": None, "model": "tiny Qwen3 (2 layers)" if args.tiny else "Qwen3-0.6B-shaped, random weights",
              "model_config": s.model, "settings": settings, "python": platform.python_version(),
              "torch": torch.__version__, "cuda": torch.version.cuda,
              "transformers": None, "attention_backend": None, "parts": {},
              "parts_left_out": sorted(filter(None, args.skip.split(",")))}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def write():
        headline(report)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        if args.markdown:
            args.markdown.parent.mkdir(parents=True, exist_ok=True)
            args.markdown.write_text(markdown(report) + "\n")

    if args.dry_run or (not args.tiny and not torch.cuda.is_available()):
        report["skipped"] = "dry run" if args.dry_run else "no CUDA device (use --tiny on a CPU)"
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        if args.markdown:
            args.markdown.write_text(f"GPU benchmark not run ({report['skipped']})\n")
        print(f"GPU benchmark not run ({report['skipped']}); settings: {json.dumps(settings)}")
        return 0 if args.dry_run else 1
    try:
        return run_all(args, s, budget, report, write)
    except Exception as e:  # outside any part (the checkpoint, the engine's start): the JSON says so
        traceback.print_exc()
        report["error"] = f"{type(e).__name__}: {e}"
        write()
        print(markdown(report))
        return 1


def run_all(args, s: Settings, budget: Budget, report: dict, write) -> int:
    import transformers

    from worker.engine import LLMEngine

    device = torch.device("cpu") if args.tiny else torch.device("cuda", torch.cuda.current_device())
    report.update(device=device_name(device), transformers=transformers.__version__)
    skip = set(filter(None, args.skip.split(",")))
    run = Run(report, budget, s, write)
    with tempfile.TemporaryDirectory(prefix="mili-bench-gpu-") as tmp:
        t0 = time.perf_counter()
        model_dir = build_checkpoint(Path(tmp), s.model, getattr(torch, s.dtype), device, args.seed)
        report["checkpoint_seconds"] = time.perf_counter() - t0
        config = engine_config(args, s, model_dir, device)
        report["engine_config"] = {k: v for k, v in dataclasses.asdict(config).items() if k != "model"}
        t0 = time.perf_counter()
        engine = LLMEngine(config)
        report["engine_start_seconds"] = time.perf_counter() - t0  # loading, the KV cache, any graph capture
        report["attention_backend"] = engine.attention_backend.name
        report["layer_ops"] = engine.layer_ops.name
        if engine.runner.decode_graphs is not None:  # as a server does at startup: no timed step waits for a capture
            t0 = time.perf_counter()
            report["decode_graphs_captured"] = engine.runner.decode_graphs.capture_all()
            report["decode_graphs_capture_seconds"] = time.perf_counter() - t0
        report["decode_graphs"] = engine.runner.decode_graphs_status
        vocab = engine.model_config.vocab_size
        engine_timing.warm_up(engine, vocab, random.Random(args.seed + 3), batch=8)
        report["warm_up"] = "one 16-token request and a batch of 8, 8 tokens each, before anything is timed"
        mili_parts(run, engine, vocab, args.seed, skip)
        # The profile before transformers: where MILI's step time goes is worth more than the rest of transformers'
        # offline batch, which stops at the budget anyway (two GPU runs lost the profile to it).
        if "profile" not in skip:
            run.part("profile", lambda: profile_part(engine, s, vocab, args.seed))
        if "transformers" not in skip:
            run.part("transformers", lambda: transformers_part(run, model_dir, device, vocab, args.seed, args))
    write()
    print(markdown(report))
    return 1 if run.errors else 0


if __name__ == "__main__":
    sys.exit(main())

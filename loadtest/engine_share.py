"""MILI's engine against the machine: the matmul work a throughput run does each second, as a share of the
ceiling the machine's measured peaks set for that arithmetic.

    python -m loadtest.engine_share [--concurrency 32] [--configs int8x2,int8] [--gguf FILE.gguf]

Runs loadtest/bench_offline.py's workload (random-word prompts of --input-len tokens, --output-len tokens each,
greedy, ignore_eos, everything queued at once) on the engine in this process, then measures the peaks
(loadtest/peaks.py). The work is counted from the model's shapes (`matmul_ops`): every token fed through every
decoder layer's projections, except that the last layer runs its output projection and MLP only for the rows
that sample, and the head once per generated token. Attention, norms and the rest are left out of the count,
so the share is a lower bound of how busy the vector units are. The ceiling: vpdpbusd's rate for one-part
int8 activations, half of it for two parts (two products per multiply-add); AMX's where the kernels use it.
Writes loadtest/results/<name>.md, the CPU named. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from loadtest.bench_offline import CONFIGS, RESULTS, make_prompts, time_mili
from loadtest.machine import cpu_name
from loadtest.peaks import Peaks, measure, quant_ceiling, table
from shared.default_model import DEFAULT_SERVED_NAME, converted_gguf, default_gguf_path


def layer_params(config: dict) -> tuple[int, int]:
    """Weights of one decoder layer's (q, k, v) projections and of its (o, gate, up, down) projections."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or hidden // heads
    qkv = hidden * (heads + 2 * kv_heads) * head_dim
    rest = heads * head_dim * hidden + 3 * hidden * inter
    return qkv, rest


def matmul_ops(config: dict, prompt_tokens: int, output_tokens: int) -> int:
    """Operations (2 per multiply-add) of one request's matmuls: prompt_tokens + output_tokens - 1 rows fed (the
    last generated token is never fed back), output_tokens rows sampled."""
    qkv, rest = layer_params(config)
    layers = config["num_hidden_layers"]
    fed = prompt_tokens + output_tokens - 1
    head = config["hidden_size"] * config["vocab_size"]
    return 2 * (fed * (layers * qkv + (layers - 1) * rest) + output_tokens * (rest + head))


def ceiling(peaks: Peaks, activations: str) -> float:
    """The engine's ceiling in one activation mode: AMX's where the CPU has it (the kernels' path from 16 rows)."""
    return quant_ceiling(peaks, activations, "int8 amx" in peaks.ops_all_threads)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", type=Path, help="the model (default: the default model's GGUF)")
    p.add_argument("--concurrency", default="32", type=lambda s: [int(c) for c in s.split(",")])
    p.add_argument("--requests-per-level", type=int, default=4)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--context-tokens", type=int, default=16384)
    p.add_argument("--configs", default="int8x2,int8", type=lambda s: s.split(","))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="engine-share")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    gguf = args.gguf or default_gguf_path()
    model_dir = converted_gguf(gguf, DEFAULT_SERVED_NAME if args.gguf is None else gguf.stem)
    config = json.loads((model_dir / "config.json").read_text())
    prompts = make_prompts(model_dir, args.requests_per_level * max(args.concurrency), args.input_len, args.seed)
    runs = []
    for c in args.concurrency:
        batch = prompts[:args.requests_per_level * c]
        mean_prompt = sum(map(len, batch)) / len(batch)
        for name in args.configs:
            tok_s = time_mili(model_dir, batch, c, args.output_len, args.context_tokens, CONFIGS[name])
            gops = matmul_ops(config, mean_prompt, args.output_len) * tok_s / args.output_len / 1e9
            print(f"c={c} {name}: {tok_s:.1f} tok/s, matmuls {gops:.0f} GOP/s", flush=True)
            runs.append((c, name, tok_s, gops))
    peaks = measure()
    lines = [f"# MILI's engine against the machine's peaks, {cpu_name()}", "",
             f"Command: `python -m loadtest.engine_share {' '.join(sys.argv[1:] if argv is None else argv)}` ({time.strftime('%Y-%m-%d')}); "
             f"model {gguf.name}; prompts of about {args.input_len} tokens, {args.output_len} output tokens, greedy; "
             f"load average (1 min) {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} CPUs.", "",
             "| concurrency | activations | output tok/s | matmul GOP/s | ceiling GOP/s | share |",
             "|---:|---|---:|---:|---:|---:|"]
    for c, name, tok_s, gops in runs:
        top = ceiling(peaks, CONFIGS[name].activations) / 1e9
        lines.append(f"| {c} | {name} | {tok_s:.1f} | {gops:.0f} | {top:.0f} | {gops / top:.0%} |")
    lines += ["", *table(peaks)]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

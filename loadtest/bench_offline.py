"""Offline throughput against OpenVINO GenAI, which has no HTTP server: MILI's engine in process (serving the
GGUF's quantized blocks) beside OpenVINO GenAI's own pipelines on the same model exported to int4 (groups of 32),
same token ids, same workload. No gateway, no HTTP, no tokenizer on either side: engine against engine.

    python -m loadtest.bench_offline [--concurrency 1,8,32] [--requests-per-level 4] [--gguf FILE.gguf]
                                     [--configs int8x2,int8,int8+kv8] [--rounds 3]

At each concurrency c: requests-per-level x c prompts of about --input-len tokens (the sweep's random words,
tokenized once with the model's tokenizer), at most c in flight, --output-len tokens each, greedy, ignore_eos.
MILI: all queued at once, max_num_seqs c, in each of --configs (CONFIGS: its quantized kernels' activations and its
KV cache's dtype: int8x2, what `mili serve` runs by default; int8, llama.cpp's arithmetic; int8+kv8, int8 with an
int8 KV cache, what OpenVINO's CPU plugin runs by default, whose settings the table records). OpenVINO, the faster
of its two ways: its continuous-batching pipeline (all queued at once, max_num_seqs c) or its stateful LLMPipeline on
left-padded batches of c, batch after batch. Each side is warmed up before it is timed. On a shared machine one run's
figures move by 5-10%: --rounds N alternates N rounds of both sides (OpenVINO first in the first round, MILI in the
second, and so on) and reports each figure's median, every round's listed below the table. OpenVINO is installed
and the model exported on first use (loadtest/peers/openvino_genai.py, a venv of its own under build/peers/).
Results go to loadtest/results/<name>.json and .md, the CPU named.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from loadtest.bench_serve import random_prompt
from loadtest.machine import cpu_name
from loadtest.peers import openvino_genai
from shared.default_model import DEFAULT_SERVED_NAME, converted_gguf, default_gguf_path

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class MiliConfig:
    activations: str  # --activation-quantization
    kv_cache_dtype: str  # --kv-cache-dtype
    note: str


CONFIGS = {
    "int8x2": MiliConfig("int8x2", "auto", "activations in two int8 parts and the KV cache in the model's dtype, "
                         "`mili serve`'s default"),
    "int8": MiliConfig("int8", "auto", "activations in one int8 part, llama.cpp's arithmetic "
                       "(`--activation-quantization int8`)"),
    "int8+kv8": MiliConfig("int8", "int8", "one-part int8 activations and an int8 KV cache (`--activation-quantization "
                           "int8 --kv-cache-dtype int8`), the arithmetic OpenVINO's CPU plugin runs by default"),
}


def make_prompts(model_dir: Path, count: int, words: int, seed: int) -> list[list[int]]:
    """The sweep's kind of prompt (random common words, about one token each), as token ids: the model's own
    tokenizer.json through the `tokenizers` library, as MILI's gateway reads it (no transformers in this process)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    rng = random.Random(seed)
    return [tokenizer.encode(random_prompt(rng, words), add_special_tokens=False).ids for _ in range(count)]


def time_mili(model_dir: Path, prompts: list[list[int]], concurrency: int, output_len: int,
              context_tokens: int, config: MiliConfig) -> float:
    """Output tok/s of MILI's engine on `prompts`, at most `concurrency` sequences in flight, in `config`."""
    from shared.config import EngineConfig
    from shared.sampling_params import SamplingParams
    from worker.engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=str(model_dir), max_num_seqs=concurrency,
                                    num_kv_blocks=context_tokens // 16, activation_quantization=config.activations,
                                    kv_cache_dtype=config.kv_cache_dtype))
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    engine.generate([p[:16] for p in prompts[:concurrency]], params)  # warm-up: first-step costs stay out
    t0 = time.perf_counter()
    done = engine.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    produced = sum(len(ids) for c in done for ids in c.token_ids)
    del engine
    gc.collect()
    return produced / elapsed


def time_levels(model_dir: Path, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """MILI's output tok/s at every concurrency level in every configuration: {level: {configuration: tok/s}}."""
    return {str(c): {mode: time_mili(model_dir, prompts[:args.requests_per_level * c], c, args.output_len,
                                     args.context_tokens, CONFIGS[mode]) for mode in args.configs}
            for c in args.concurrency}


def median_level(rounds: list[dict], c: str, configs: list[str]) -> dict:
    """One concurrency level over the rounds: each side's median output tok/s (OpenVINO's: of its faster pipeline in
    each round), the pipeline that was faster most often, each pipeline's median, and every round's figures."""
    ov = [r["openvino_genai"]["levels"][c] for r in rounds]
    pipelines = [run["pipeline"] for run in ov]
    return {
        "mili": {m: statistics.median(r["mili"][c][m] for r in rounds) for m in configs},
        "openvino_genai": {
            "output_throughput": statistics.median(run["output_throughput"] for run in ov),
            "pipeline": max(sorted(set(pipelines)), key=pipelines.count),
            "all": {name: statistics.median(run["all"][name] for run in ov) for name in ov[0]["all"]},
        },
        "per_round": {"openvino_genai": [run["output_throughput"] for run in ov],
                      "mili": {m: [r["mili"][c][m] for r in rounds] for m in configs}},
    }


def markdown(results: dict) -> str:
    s = results["settings"]
    modes = s["configs"]
    lines = [
        f"Machine: {results['machine']['cpu']}, {results['machine']['cores']} cores; {results['machine']['openvino']}; "
        f"MILI with torch {results['machine']['torch']}.",
        f"Run {results['started']}. **Offline, no HTTP** (OpenVINO GenAI has no server): both engines driven in "
        f"process, engine against engine, on the same token ids: {s['requests_per_level']} x concurrency prompts "
        f"of {s['mean_prompt_tokens']:.0f} tokens on average, at most `concurrency` in flight (MILI: all queued "
        f"at once; OpenVINO GenAI: the faster of its continuous-batching pipeline, all queued at once, and its "
        f"stateful LLMPipeline on batches of `concurrency`), {s['output_len']} output tokens each, greedy, "
        f"ignore_eos; {s['threads']} threads each."
        + (f" Each figure is the median of {s['rounds']} rounds of both sides, the side that runs first flipping each "
           f"round; every round's are at the end." if s.get("rounds", 1) > 1 else ""),
        f"Model: {s['model']}. MILI serves the GGUF's own quantized blocks: "
        + "; ".join(f"{m}: {CONFIGS[m].note}" for m in modes)
        + f". OpenVINO GenAI its int4 export (optimum-intel, --weight-format int4 --group-size "
        f"{openvino_genai.GROUP_SIZE})" + _ov_settings(results) + ".",
        "",
        "Output tokens/s by concurrency:",
        "",
        "| concurrency | " + " | ".join(f"mili {m} (engine)" for m in modes) + " | openvino-genai | "
        "openvino-genai pipeline | " + " | ".join(f"mili {m} / openvino-genai" for m in modes) + " |",
        "|---" * (3 + 2 * len(modes)) + "|",
    ]
    for c, run in results["levels"].items():
        ov = run["openvino_genai"]["output_throughput"]
        lines.append(f"| {c} | " + " | ".join(f"{run['mili'][m]:.1f}" for m in modes)
                     + f" | {ov:.1f} | {run['openvino_genai']['pipeline']} | "
                     + " | ".join(f"{run['mili'][m] / ov:.2f}x" for m in modes) + " |")
    tried = [f"c={c}: " + ", ".join(f"{k} {v:.1f}" for k, v in run["openvino_genai"]["all"].items())
             for c, run in results["levels"].items() if len(run["openvino_genai"]["all"]) > 1]
    if tried:
        lines += ["", "OpenVINO GenAI pipelines tried (output tok/s; the table keeps its fastest): " + "; ".join(tried)
                  + "."]
    if s.get("rounds", 1) > 1:
        lines += ["", "Every round, output tok/s in round order:", ""]
        for c, run in results["levels"].items():
            each = run["per_round"]
            parts = [f"openvino-genai {_figures(each['openvino_genai'])}"]
            parts += [f"mili {m} {_figures(each['mili'][m])}" for m in modes]
            lines.append(f"- c={c}: " + "; ".join(parts))
    return "\n".join(lines) + "\n"


def _figures(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


def _ov_settings(results: dict) -> str:
    """OpenVINO's CPU plugin defaults as it reported them (the precisions it chose for this CPU), if it did."""
    props = results.get("openvino_cpu_properties")
    if not props:
        return ""
    return ", its CPU plugin's defaults as it reported them: " + ", ".join(f"{k} {v}" for k, v in props.items())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", type=Path, help="the model (default: the default model's GGUF)")
    p.add_argument("--concurrency", default="1,8,32", type=lambda s: [int(c) for c in s.split(",")])
    p.add_argument("--requests-per-level", type=int, default=4, help="requests per level: this x concurrency")
    p.add_argument("--input-len", type=int, default=128, help="prompt length in words (about as many tokens)")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--context-tokens", type=int, default=16384, help="MILI's KV capacity, in tokens")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1, help="rounds of both sides, the first to run flipping each round; "
                   "the table gives each figure's median, and every round's at the end")
    p.add_argument("--configs", default=",".join(CONFIGS), type=lambda s: s.split(","),
                   help=f"MILI's configurations to time, comma-separated ({', '.join(CONFIGS)})")
    p.add_argument("--name", default="offline-openvino", help="result file name")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if not set(args.configs) <= set(CONFIGS):
        p.error(f"--configs: choose from {', '.join(CONFIGS)}")
    if min(args.concurrency) < 1 or args.requests_per_level < 1 or args.rounds < 1:
        p.error("--concurrency levels, --requests-per-level and --rounds must be at least 1")
    if args.context_tokens < max(args.concurrency) * (args.input_len + args.output_len) * 2:
        p.error(f"--context-tokens {args.context_tokens} does not hold {max(args.concurrency)} requests of "
                f"{args.input_len} + {args.output_len} tokens with room to spare")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    gguf = args.gguf or default_gguf_path()
    model_dir = converted_gguf(gguf, DEFAULT_SERVED_NAME if args.gguf is None else gguf.stem)
    prompts = make_prompts(model_dir, args.requests_per_level * max(args.concurrency), args.input_len, args.seed)
    print(f"OpenVINO GenAI: installing and exporting on first use ({openvino_genai.install_dir()})", flush=True)
    ov_model = openvino_genai.export_int4(model_dir)
    rounds = []  # per round: OpenVINO's run (every level) and MILI's every level and configuration
    for r in range(args.rounds):
        if args.rounds > 1:
            print(f"round {r + 1} of {args.rounds}", flush=True)
        # Whichever side runs first in a round may find the machine in another state: the order flips each round.
        mili = None if r % 2 == 0 else time_levels(model_dir, prompts, args)
        ov = openvino_genai.run_offline(ov_model, prompts, args.concurrency, args.output_len, args.threads,
                                        args.requests_per_level)
        if mili is None:
            mili = time_levels(model_dir, prompts, args)
        for c in args.concurrency:
            for mode, tok_s in mili[str(c)].items():
                print(f"  mili {mode:<7}   c={c:<3} {tok_s:8.1f} tok/s; mili / openvino-genai "
                      f"{tok_s / ov['levels'][str(c)]['output_throughput']:.2f}x", flush=True)
        rounds.append({"openvino_genai": ov, "mili": mili})
    levels = {str(c): median_level(rounds, str(c), args.configs) for c in args.concurrency}
    results = {
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
                    "openvino": openvino_genai.version()},
        "settings": {"model": gguf.name, "requests_per_level": args.requests_per_level, "input_len": args.input_len,
                     "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts), "output_len": args.output_len,
                     "threads": args.threads, "context_tokens": args.context_tokens, "seed": args.seed,
                     "configs": args.configs, "rounds": args.rounds},
        "openvino_cpu_properties": rounds[-1]["openvino_genai"].get("cpu_properties", {}), "started": started,
        "rounds": args.rounds, "levels": levels,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{args.name}.json").write_text(json.dumps(results, indent=2))
    table = markdown(results)
    (args.out_dir / f"{args.name}.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

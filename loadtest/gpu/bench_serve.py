"""What serving costs beside the engine: the same closed-loop workload through the engine alone and through
`mili serve`, at several concurrencies.

    python -m loadtest.gpu.bench_serve [--model-dir DIR] [--device cuda] [--concurrency 1,32,128] [--out FILE]

At each concurrency C, C requests are kept in flight (a new one starts when one ends) until --requests-per-level
x C have run; each has a prompt of --input-len words and --output-len output tokens (ignore_eos, greedy). First
the engine alone runs them in this process (LLMEngine.step in a loop: no HTTP, no tokenizer, no processes); then
`mili serve` (the gateway and its worker process) serves them to the repository's benchmark client
(loadtest/bench_serve.py, streaming /v1/completions). Both use the same prompts, the same engine settings and
one warm-up request first. The ratio served/engine output tokens/s is what the gateway, the wire and the
streaming cost at that concurrency; the client's TTFT and TPOT are reported beside the engine's, and per
level the CPU time the gateway and the worker processes used per output token (a gateway near one core's
worth of tokens per second is the limit on one GPU) and the share of steps a stream sent merged with the
step before because it had fallen behind (mili_stream_merged_deltas_total).

The model: an HF-format checkpoint, by default a random Qwen3-0.6B-shaped one in bf16 (loadtest/fixtures/random_checkpoint.py,
as the engine benchmark's). Random-weight checkpoints have no tokenizer, and their outputs are any id of
the vocabulary, so a checkpoint without tokenizer.json gets a word-level one written beside it: the benchmark
client's words first (one token per prompt word), then `w<N>` for every other id, so every output decodes.
`--tiny` makes a two-layer random Qwen3 and runs on the CPU in seconds (what CI checks of this script).
Nothing here asserts speeds.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx2
import torch

from loadtest import bench_serve
from loadtest.fixtures import random_checkpoint
from loadtest.fixtures.probes import cpu_seconds, free_port, metric_total
from loadtest.machine import device_name
from loadtest.servers import RunningServer, ServerSpec
from shared.config import EngineConfig, parse_size
from shared.sampling_params import SamplingParams
from worker.checkpoint.model_config import ModelConfig
from worker.engine import LLMEngine

SERVED_NAME = "bench"
UNKNOWN = "[UNK]"


def word_tokenizer(vocab_size: int):
    """A word-level tokenizer of exactly vocab_size ids: the benchmark client's words, then w<N>."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = list(dict.fromkeys([UNKNOWN, *bench_serve.WORDS]))
    if vocab_size < len(words):
        raise ValueError(f"a vocabulary of {vocab_size} cannot hold the benchmark's {len(words)} words")
    vocab = {w: i for i, w in enumerate(words)}
    vocab.update({f"w{i}": i for i in range(len(words), vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNKNOWN))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


def ensure_tokenizer(model_dir: Path) -> None:
    if not (model_dir / "tokenizer.json").is_file():
        word_tokenizer(ModelConfig.from_dir(model_dir).vocab_size).save(str(model_dir / "tokenizer.json"))


def engine_settings(args: argparse.Namespace) -> dict:
    """The engine's settings, shared by the in-process engine and `mili serve` (as its flags)."""
    return dict(device=args.device, dtype=args.dtype, max_num_seqs=max(args.levels),
                max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_memory=parse_size(args.kv_cache_memory),
                max_model_len=args.max_model_len)


def serve_flags(settings: dict) -> list[str]:
    """The settings as `mili serve` flags: --max-num-seqs 128 ..."""
    return [arg for name, value in settings.items() for arg in (f"--{name.replace('_', '-')}", str(value))]


def client_args(args: argparse.Namespace, concurrency: int, base_url: str = "", num_prompts: int | None = None):
    return bench_serve.parse_args([
        "--base-url", base_url or "http://unused", "--model", SERVED_NAME, "--seed", str(args.seed),
        "--num-prompts", str(num_prompts or args.requests_per_level * concurrency),
        "--concurrency", str(concurrency), "--input-len", str(args.input_len), "--output-len", str(args.output_len),
        "--quiet"])


def run_engine(engine: LLMEngine, prompts: list[list[int]], concurrency: int, output_len: int) -> dict:
    """Closed loop: `concurrency` requests in flight until all prompts ran. Output tokens/s, TTFT and TPOT."""
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    waiting = list(enumerate(prompts))
    started: dict[str, float] = {}
    first: dict[str, float] = {}
    ended: dict[str, float] = {}
    produced = 0
    start = time.perf_counter()
    while waiting or len(ended) < len(started):
        while waiting and len(started) - len(ended) < concurrency:
            i, prompt = waiting.pop(0)
            started[f"r{i}"] = time.perf_counter()
            engine.add_request(f"r{i}", prompt, params)
        for out in engine.step():
            now = time.perf_counter()
            produced += len(out.new_token_ids)
            if out.new_token_ids:
                first.setdefault(out.request_id, now)
            if out.finish_reason is not None:
                ended[out.request_id] = now
    duration = time.perf_counter() - start
    ttft = [first[r] - started[r] for r in started]
    tpot = [(ended[r] - first[r]) / (output_len - 1) for r in started] if output_len > 1 else []
    return {"output_tok_s": produced / duration, "output_tokens": produced, "duration_s": duration,
            "ttft_median_ms": 1e3 * statistics.median(ttft), "tpot_median_ms": 1e3 * statistics.median(tpot)
            if tpot else 0.0}


def bench_engine(args: argparse.Namespace, settings: dict, tokenizer) -> tuple[list[dict], dict]:
    """Each level's figures, and what served them (attention backend, decode graphs)."""
    engine = LLMEngine(EngineConfig(model=str(args.model_dir), **settings))
    if engine.runner.decode_graphs is not None:  # as `mili serve`'s worker does at startup, before any timing
        engine.runner.decode_graphs.capture_all()
    info = {"attention_backend": engine.attention_backend.name, "decode_graphs": engine.runner.decode_graphs_status}
    warm = [tokenizer.encode(p).ids for p in bench_serve.make_prompts(client_args(args, 1, num_prompts=1))[0]]
    run_engine(engine, warm, 1, 8)
    results = []
    for c in args.levels:
        prompts = bench_serve.make_prompts(client_args(args, c))[0]
        results.append(run_engine(engine, [tokenizer.encode(p).ids for p in prompts], c, args.output_len))
        print(f"engine      concurrency {c:>4}: {results[-1]['output_tok_s']:9.1f} output tok/s", flush=True)
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the server's worker needs the memory next
    return results, info


def bench_server(args: argparse.Namespace, settings: dict, log_dir: Path) -> list[dict]:
    flags = serve_flags(settings)
    spec = ServerSpec("mili", lambda port, _: [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port),
                                                "--model", str(args.model_dir), "--served-model-name",
                                                SERVED_NAME, *flags],
                      restart_per_level=False, model_processes="children")
    server = RunningServer(spec, args.port or free_port(), max(args.levels), log_dir / "server.log", SERVED_NAME)
    try:
        server.wait_ready(timeout=args.server_timeout)
        asyncio.run(bench_serve.run(client_args(args, 1, server.url, num_prompts=1)))  # warm-up
        results = []
        processes = server.processes()
        for c in args.levels:
            cpu_before, merged_before = process_cpu(processes), merged_deltas(server.url)
            summary = asyncio.run(bench_serve.run(client_args(args, c, server.url)))
            cpu_after, merged_after = process_cpu(processes), merged_deltas(server.url)
            if summary["errors"]:
                raise RuntimeError(f"{summary['errors']} requests failed at concurrency {c}: "
                                   f"{summary['error_samples']}")
            tokens = summary["output_throughput"] * summary["duration_s"]
            results.append({"output_tok_s": summary["output_throughput"], "output_tokens": tokens,
                            "duration_s": summary["duration_s"], "ttft_median_ms": summary["ttft"]["median_ms"],
                            "tpot_median_ms": summary["tpot"]["median_ms"],
                            # The gateway's cost at this speed: its CPU time per token, and how often a
                            # stream had fallen behind its worker (steps merged into one event).
                            "cpu_us_per_token": {role: 1e6 * (cpu_after[role] - cpu_before[role]) / tokens
                                                 for role in processes},
                            "merged_delta_share": (merged_after - merged_before) / tokens})
            print(f"mili serve  concurrency {c:>4}: {results[-1]['output_tok_s']:9.1f} output tok/s", flush=True)
        return results
    except (RuntimeError, TimeoutError):
        server.stop()
        print(Path(server.log.name).read_text()[-4000:], file=sys.stderr)
        raise
    finally:
        server.stop()


def process_cpu(processes: dict[str, int]) -> dict[str, float]:
    return {role: cpu_seconds(pid) or 0.0 for role, pid in processes.items()}


def merged_deltas(url: str) -> float:
    """mili_stream_merged_deltas_total from the server's /metrics."""
    return metric_total(httpx2.get(f"{url}/metrics", timeout=10).text, "mili_stream_merged_deltas_total")


def table(report: dict) -> str:
    lines = [f"Serving against the engine alone on {report['device']} ({report['input_len']} prompt words, "
             f"{report['output_len']} output tokens, greedy):",
             "| concurrency | engine tok/s | served tok/s | served / engine | TTFT engine / served (ms) "
             "| TPOT engine / served (ms) | gateway CPU us / token | merged steps |", "|---|---|---|---|---|---|---|---|"]
    for level in report["levels"]:
        e, s = level["engine"], level["served"]
        lines.append(f"| {level['concurrency']} | {e['output_tok_s']:.1f} | {s['output_tok_s']:.1f} | "
                     f"{level['served_over_engine']:.2f}x | {e['ttft_median_ms']:.1f} / {s['ttft_median_ms']:.1f} | "
                     f"{e['tpot_median_ms']:.2f} / {s['tpot_median_ms']:.2f} | "
                     f"{s['cpu_us_per_token']['gateway']:.0f} | {100 * s['merged_delta_share']:.0f}% |")
    return "\n".join(lines)


def random_model(out_dir: Path, tiny: bool, device: str) -> Path:
    """A random Qwen3-0.6B-shaped bf16 checkpoint (loadtest/fixtures/random_checkpoint.py), or its tiny float32 sibling."""
    spec, dtype = (random_checkpoint.TINY, torch.float32) if tiny else (random_checkpoint.QWEN3_0_6B, torch.bfloat16)
    return random_checkpoint.build_checkpoint(out_dir, spec, dtype, torch.device(device), seed=0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.gpu.bench_serve", description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path,
                   help="an HF-format checkpoint (default: a random Qwen3-0.6B-shaped one, made on --device)")
    p.add_argument("--tiny", action="store_true", help="a two-layer random Qwen3 on the CPU (seconds)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--concurrency", default="1,32,128", help="comma-separated levels")
    p.add_argument("--requests-per-level", type=int, default=4, help="requests per level, times the concurrency")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--kv-cache-memory", default="8GiB")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=0, help="`mili serve`'s port (0: any free one)")
    p.add_argument("--server-timeout", type=float, default=300.0, help="seconds for `mili serve` to be ready")
    p.add_argument("--out", type=Path, help="write the results here as JSON (and a markdown table beside it)")
    p.add_argument("--dry-run", action="store_true", help="write the plan (settings, levels) and run nothing")
    args = p.parse_args(argv)
    if args.tiny:
        args.device, args.dtype, args.kv_cache_memory, args.max_model_len = "cpu", "float32", "64MiB", 512
        args.input_len, args.output_len = min(args.input_len, 32), min(args.output_len, 16)
        if args.concurrency == p.get_default("concurrency"):
            args.concurrency = "1,4"
        args.requests_per_level = min(args.requests_per_level, 2)
    args.levels = [int(c) for c in args.concurrency.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        plan = {"skipped": "dry run", "settings": engine_settings(args), "levels": [],
                "concurrency": args.levels, "input_len": args.input_len, "output_len": args.output_len}
        if args.out:
            args.out.write_text(json.dumps(plan, indent=2))
        print(f"serving benchmark not run (dry run): concurrency {args.concurrency}")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-gpu-serve-") as tmp:
        if args.model_dir is None:
            args.model_dir = random_model(Path(tmp) / "random-qwen3", args.tiny, args.device)
        ensure_tokenizer(args.model_dir)
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
        settings = engine_settings(args)
        engine, engine_info = bench_engine(args, settings, tokenizer)
        served = bench_server(args, settings, Path(tmp))
    report = {"device": device_name(args.device), "settings": settings, "input_len": args.input_len,
              "output_len": args.output_len, "requests_per_level": args.requests_per_level, **engine_info,
              "torch": torch.__version__,
              "levels": [{"concurrency": c, "engine": e, "served": s, "served_over_engine": s["output_tok_s"] /
                          e["output_tok_s"]} for c, e, s in zip(args.levels, engine, served)]}
    text = table(report)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
        args.out.with_suffix(".md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The worker link's codec against another commit's, in one process, and optionally the gateway's CPU per token.

    python -m loadtest.bench_wire --baseline f5c7c53                         # codecs: encode, decode
    python -m loadtest.bench_wire --baseline f5c7c53 --serve-base ../base    # also `mili serve`, A B A B

Codecs: this checkout's shared/wire.py and the baseline commit's (read with `git show`, loaded as its own
module) encode and decode the same messages: a StepOutputs of 128 one-token deltas (a decode step at 128
sequences) and an AddRequest of a 1024-token prompt. Best of --repeats timings of --number calls each.

Serving (--serve-base DIR, a checkout of the baseline): `mili serve` on a random two-layer Qwen3
(loadtest/fixtures/random_checkpoint.py's TINY, made here with transformers), from this checkout and from
DIR in turn, --rounds times each, alternating; each round the benchmark client (loadtest/bench_serve.py)
streams 4 x concurrency requests of --output-len tokens, and the gateway's CPU seconds (/proc) over the
tokens served is its cost per token. Prints figures and ratios; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loadtest import bench_serve
from loadtest.fixtures.probes import cpu_seconds, free_port
from loadtest.servers import ROOT, RunningServer, ServerSpec
from shared import wire as new_wire
from shared.sampling_params import SamplingParams

SERVED_NAME = "bench"


def load_baseline(commit: str):
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:shared/wire.py"], check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="mili-wire-")) / "wire_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("wire_baseline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["wire_baseline"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def messages(w, deltas: int, prompt: int) -> dict:
    stats = w.WorkerStats(num_running=deltas, num_waiting=3, kv_blocks_total=4096, kv_blocks_used=1200,
                          prefix_cache_query_tokens=123456, prefix_cache_hit_tokens=65432, num_preemptions=2)
    step = w.StepOutputs(deltas=[w.TokenDelta(request_id=f"cmpl-{i:032x}-0", index=0, token_ids=[1000 + i],
                                              finish_reason=None, num_prompt_tokens=128, num_cached_tokens=64)
                                 for i in range(deltas)], stats=stats)
    params = w.sampling_params_to_wire(SamplingParams(max_tokens=128, temperature=0.7, top_p=0.9, seed=7))
    add = w.AddRequest(request_id="cmpl-0123456789abcdef0123456789abcdef", prompt_token_ids=list(range(prompt)),
                       params=params, timeout_s=30.0)
    return {f"StepOutputs ({deltas} deltas)": step, f"AddRequest ({prompt}-token prompt)": add}


def best_us(fn, number: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, time.perf_counter() - start)
    return 1e6 * best / number


def bench_codecs(args, baseline) -> None:
    codecs = {"baseline (msgpack)": baseline, "this (msgspec)": new_wire}
    built = {name: messages(w, args.deltas, args.prompt) for name, w in codecs.items()}
    allowed = {name: tuple(type(m) for m in built[name].values()) for name in codecs}
    print(f"codec timings, best of {args.repeats} x {args.number} calls, microseconds per frame:")
    for label in built["this (msgspec)"]:
        times = {}
        for name, w in codecs.items():
            message = built[name][label]
            frame = w.encode(message)
            assert w.decode(frame, allowed[name]) == message
            times[name] = (best_us(lambda: w.encode(message), args.number, args.repeats),
                           best_us(lambda: w.decode(frame, allowed[name]), args.number, args.repeats), len(frame))
        (be, bd, bn), (ne, nd, nn) = times.values()
        print(f"  {label}: encode {be:8.2f} -> {ne:8.2f} us ({be / ne:5.1f}x), decode {bd:8.2f} -> {nd:8.2f} us "
              f"({bd / nd:5.1f}x), {bn} -> {nn} bytes")


def tiny_model(out_dir: Path) -> Path:
    import torch

    from loadtest.fixtures import random_checkpoint
    from loadtest.gpu.bench_serve import ensure_tokenizer

    if not (out_dir / "config.json").is_file():
        random_checkpoint.build_checkpoint(out_dir, random_checkpoint.TINY, torch.float32, torch.device("cpu"), 0)
    ensure_tokenizer(out_dir)
    return out_dir


def serve_round(tree: Path, model: Path, args, log: Path) -> dict:
    spec = ServerSpec("mili", lambda port, _: [
        sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--model", str(model),
        "--served-model-name", SERVED_NAME, "--dtype", "float32", "--max-num-seqs", str(args.concurrency),
        "--worker-threads", "1"], restart_per_level=False, model_processes="children")
    server = RunningServer(spec, free_port(), args.concurrency, log, SERVED_NAME, cwd=tree)
    try:
        server.wait_ready(timeout=300)
        client = ["--base-url", server.url, "--model", SERVED_NAME, "--input-len", "128", "--quiet",
                  "--output-len", str(args.output_len)]
        asyncio.run(bench_serve.run(bench_serve.parse_args([*client, "--num-prompts", "4", "--concurrency", "4"])))
        gateway = server.processes()["gateway"]
        before = cpu_seconds(gateway)
        summary = asyncio.run(bench_serve.run(bench_serve.parse_args(
            [*client, "--num-prompts", str(4 * args.concurrency), "--concurrency", str(args.concurrency)])))
        cpu = cpu_seconds(gateway) - before
        if summary["errors"]:
            raise RuntimeError(f"{summary['errors']} requests failed: {summary['error_samples']}")
        tokens = summary["output_throughput"] * summary["duration_s"]
        return {"tok_s": summary["output_throughput"], "cpu_us_per_token": 1e6 * cpu / tokens}
    finally:
        server.stop()


def bench_serving(args) -> None:
    work = Path(tempfile.mkdtemp(prefix="mili-bench-wire-"))
    model = tiny_model(args.model_dir or work / "tiny-qwen3")
    trees = {"baseline": args.serve_base.resolve(), "this": ROOT}
    results: dict[str, list[dict]] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name, tree in trees.items():
            result = serve_round(tree, model, args, work / f"{name}-{r}.log")
            results[name].append(result)
            print(f"  round {r + 1} {name:>8}: {result['tok_s']:7.0f} tok/s, gateway {result['cpu_us_per_token']:5.1f} "
                  f"us CPU / token", flush=True)
    base = [x["cpu_us_per_token"] for x in results["baseline"]]
    this = [x["cpu_us_per_token"] for x in results["this"]]
    print(f"gateway CPU per token at concurrency {args.concurrency}: baseline {min(base):.1f}-{max(base):.1f} us, "
          f"this {min(this):.1f}-{max(this):.1f} us, ratio of means {sum(this) / sum(base):.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench_wire", description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="the commit whose shared/wire.py to compare against")
    p.add_argument("--deltas", type=int, default=128)
    p.add_argument("--prompt", type=int, default=1024)
    p.add_argument("--number", type=int, default=200)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--serve-base", type=Path, help="a checkout of the baseline: also time `mili serve` from both")
    p.add_argument("--model-dir", type=Path, help="where the tiny random model is (made there if missing)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--output-len", type=int, default=128)
    args = p.parse_args(argv)
    bench_codecs(args, load_baseline(args.baseline))
    if args.serve_base:
        bench_serving(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

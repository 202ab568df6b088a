"""Where one request's per-token time goes at concurrency 1: the engine's decode step split into its stages,
the decoder's layers against the bytes they must read at this machine's bandwidth, and (with --server) what
the gateway, ZeroMQ and detokenization add on top, measured as a real server's time per output token.

    python -m loadtest.c1_breakdown [--model default] [--context 128] [--steps 64] [--server]

Stages are timed by wrapping the engine's own methods (nothing in the engine changes): scheduling, input
building, the decoder (the quantized decode program: embedding and input copies, then one OpenMP program
for every layer), the output head, the sampler, and the rest of `step` (bookkeeping, outputs, the KV audit).
Each is reported as the median over --steps steady decode steps, in wall time and in the main thread's CPU
time (the program's OpenMP threads are not in the latter). Bytes per token: every quantized projection's
packed blocks, the head's, and the context's K and V, over the measured read bandwidth: the floor a
bandwidth-bound decoder cannot go below. On a shared machine wall times carry others' load: read shares.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from gateway.serve import resolve_model
from loadtest.bench_engine import make_prompts
from loadtest.bench_kernels import read_bandwidth
from loadtest.machine import cpu_name
from shared.config import EngineConfig
from shared.sampling_params import SamplingParams
from worker.engine import LLMEngine
from worker.quant.linear import QuantLinear

STAGES = ("schedule", "prepare", "decoder", "head", "sampler", "rest of step")


class StageClock:
    def __init__(self):
        self.wall: dict[str, list[float]] = defaultdict(list)
        self.cpu: dict[str, list[float]] = defaultdict(list)

    @contextmanager
    def stage(self, name: str):
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.wall[name].append(time.perf_counter() - w0)
            self.cpu[name].append(time.thread_time() - c0)

    def wrap(self, obj, method: str, name: str) -> None:
        original = getattr(obj, method)

        def timed(*args, **kwargs):
            with self.stage(name):
                return original(*args, **kwargs)

        setattr(obj, method, timed)


def instrument(engine: LLMEngine, clock: StageClock) -> None:
    runner, model = engine.runner, engine.runner.model
    clock.wrap(engine.scheduler, "schedule", "schedule")
    clock.wrap(runner, "prepare", "prepare")
    clock.wrap(runner, "_program_hidden", "decoder")
    clock.wrap(model, "compute_logits", "head")
    clock.wrap(engine, "sampler", "sampler")
    clock.wrap(engine, "step", "step")


def bytes_per_token(engine: LLMEngine, context: int) -> dict[str, int]:
    model, cfg = engine.runner.model, engine.model_config
    linears = sum(seg[1].numel() * seg[1].element_size() for m in model.modules() if isinstance(m, QuantLinear)
                  and m is not getattr(model, "_quant_head", None) for seg in m.segments)
    head = getattr(model, "_quant_head", None)
    head_bytes = sum(seg[1].numel() * seg[1].element_size() for seg in head.segments) if head is not None else 0
    k = engine.runner.kv_caches[0][0]
    kv = 2 * cfg.num_layers * context * cfg.num_kv_heads * k.shape[-1] * k.element_size()
    return {"linears": linears, "head": head_bytes, "kv": kv}


def engine_breakdown(args: argparse.Namespace) -> float:
    # One 2048-token sequence's KV, whatever the model's size (a fixed budget held too few tokens for Qwen3-0.6B's).
    engine = LLMEngine(EngineConfig(model=str(resolve_model(args.model)[0]), max_model_len=2048,
                                    kv_cache_dtype=args.kv_cache_dtype, num_kv_blocks=2048 // 16))
    prompt = make_prompts(1, args.context, args.context, engine.model_config.vocab_size, seed=1)[0]
    engine.add_request("c1", prompt, SamplingParams(temperature=0.0, max_tokens=2 * args.steps + 16,
                                                    ignore_eos=True))
    for _ in range(args.steps // 2 + 4):  # the prefill, then warm-up decode steps
        engine.step()
    clock = StageClock()
    instrument(engine, clock)
    for _ in range(args.steps):
        engine.step()
    med = {n: statistics.median(v) for n, v in clock.wall.items()}
    cpu = {n: statistics.median(v) for n, v in clock.cpu.items()}
    inner = ("schedule", "prepare", "decoder", "head", "sampler")
    med["rest of step"] = med["step"] - sum(med[n] for n in inner)
    cpu["rest of step"] = cpu["step"] - sum(cpu[n] for n in inner)
    step = med["step"]
    print(f"engine decode step, batch 1, context {args.context}, {args.model}, quantization {engine.quantization}, "
          f"KV {engine.kv_dtype}, decode program: {engine.runner.decode_program_status} "
          f"(ran {engine.runner.decode_program.steps_run if engine.runner.decode_program else 0} steps)")
    print(f"| stage | wall ms (median of {args.steps}) | share | main thread CPU ms |")
    print("|---|---|---|---|")
    for n in STAGES:
        print(f"| {n} | {med[n] * 1e3:.3f} | {med[n] / step:.0%} | {cpu[n] * 1e3:.3f} |")
    print(f"| whole step | {step * 1e3:.3f} | 100% | {cpu['step'] * 1e3:.3f} |")
    bw = read_bandwidth()
    b = bytes_per_token(engine, args.context)
    total = sum(b.values())
    print(f"\nbytes per token: linears {b['linears'] / 1e6:.1f} MB, head {b['head'] / 1e6:.1f} MB, "
          f"KV {b['kv'] / 1e6:.1f} MB = {total / 1e6:.1f} MB; read bandwidth {bw / 1e9:.1f} GB/s -> floor "
          f"{total / bw * 1e3:.2f} ms; decoder + head took {(med['decoder'] + med['head']) * 1e3:.2f} ms "
          f"({total / (med['decoder'] + med['head']) / 1e9:.1f} GB/s)")
    return step


def server_tpot(args: argparse.Namespace) -> float:
    """Median time per output token of one streamed request at a time against a real `mili serve`."""
    from loadtest import bench_serve
    from loadtest.servers import RunningServer, mili_spec
    from pathlib import Path
    import tempfile

    spec = mili_spec(torch.get_num_threads(), args.model)
    log = Path(tempfile.mkdtemp()) / "server.log"
    server = RunningServer(spec, args.port, 1, log, "SmolLM2-135M-Instruct" if args.model == "default" else
                           resolve_model(args.model)[1])
    try:
        server.wait_ready()
        bench = bench_serve.parse_args(["--base-url", server.url, "--model", server.served_name, "--concurrency", "1",
                                        "--num-prompts", "6", "--input-len", str(args.context), "--output-len",
                                        str(args.steps), "--seed", "0", "--quiet"])
        asyncio.run(bench_serve.run(bench))  # warm-up
        result = asyncio.run(bench_serve.run(bench))
    finally:
        server.stop()
    return result["tpot"]["median_ms"] / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--server", action="store_true", help="also measure a real server's time per output token")
    ap.add_argument("--port", type=int, default=8123)
    args = ap.parse_args()
    print(f"machine: {cpu_name()}, torch threads {torch.get_num_threads()}")
    step = engine_breakdown(args)
    if args.server:
        tpot = server_tpot(args)
        print(f"\nserver time per output token (streamed, concurrency 1, median): {tpot * 1e3:.3f} ms; engine step "
              f"{step * 1e3:.3f} ms; gateway + ZeroMQ + detokenization + worker loop: {(tpot - step) * 1e3:.3f} ms "
              f"({(tpot - step) / tpot:.0%})")


if __name__ == "__main__":
    main()

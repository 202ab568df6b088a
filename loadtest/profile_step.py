"""Where a decode step's time goes: torch's profiler over steady decode steps of the default model (or
--model: a .gguf file or an HF-format directory, as `mili serve --model` takes).

    python -m loadtest.profile_step [--batch 1] [--context 128] [--steps 20] [--trace step.json]
    python -m loadtest.profile_step --batch 8 --compare-program   # decode program on vs off, one run
    python -m loadtest.profile_step --model build/models/qwen3-0.6b-q4_k_m.gguf --compare-program

Prints the operators by self CPU time and the step's wall time, so the largest measured cost is the
one attacked first, and whether the decode steps ran as one kernel program (worker/runner/decode_program.py).
--compare-program times the same steps with the program on and off in alternating rounds of one process
(the ratio is what to read on a shared machine). --phases prints, instead of torch's profiler (which does not see
inside the program), each kernel's milliseconds per step, its phases run alone after real steps:
    python -m loadtest.profile_step --model build/models/qwen3-0.6b-q4_k_m.gguf --batch 32 --context 190 --phases
For the Python side, run the same under py-spy:
    py-spy record --native -o step.svg -- python -m loadtest.profile_step --no-profiler
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from gateway.serve import resolve_model
from loadtest.bench_engine import make_prompts
from shared.config import ACTIVATION_QUANTIZATIONS, KV_CACHE_DTYPES, QUANTIZATIONS, EngineConfig
from shared.sampling_params import SamplingParams
from worker.engine import LLMEngine


def make_engine(args: argparse.Namespace, decode_program: bool) -> LLMEngine:
    """An engine decoding args.batch sequences of args.context prompt tokens, prefilled and warmed up."""
    # Enough tokens for the warm-up and every timed or profiled step, so no sequence finishes.
    steps = args.steps * (1 + (args.rounds if args.compare_program else 2))
    if args.context + steps + 8 > 2048:
        raise SystemExit(f"{steps} steps after a {args.context}-token context do not fit 2048 tokens")
    # KV blocks for every sequence's whole length, whatever the model's size: a byte budget that runs short
    # preempts sequences, and the steps then time a smaller batch than the one asked for.
    blocks_per_seq = -(-(args.context + steps + 8) // 16)
    engine = LLMEngine(EngineConfig(model=str(resolve_model(args.model)[0]), dtype=args.dtype,
                                    attention_backend=args.attention_backend, max_model_len=2048,
                                    quantization=args.quantization, decode_program=decode_program,
                                    activation_quantization=args.activation_quantization,
                                    kv_cache_dtype=args.kv_cache_dtype,
                                    num_kv_blocks=max(args.batch * blocks_per_seq, 2048 // 16)))
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
    for i, prompt in enumerate(make_prompts(args.batch, args.context, args.context, vocab, seed=1)):
        engine.add_request(f"p{i}", prompt, params)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    for _ in range(args.steps):  # warm-up decode steps
        engine.step()
    if len(engine.scheduler.running) != args.batch:
        raise SystemExit(f"{len(engine.scheduler.running)} of {args.batch} sequences are running")
    return engine


def time_steps(engine: LLMEngine, steps: int) -> float:
    """Milliseconds per step over `steps` decode steps."""
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return 1e3 * (time.perf_counter() - t0) / steps


def program_runs(engine: LLMEngine) -> int:
    program = engine.runner.decode_program
    return 0 if program is None else program.steps_run


def describe(engine: LLMEngine, args: argparse.Namespace, step_ms: float, runs: int, steps: int) -> str:
    return (f"{args.model}, quantization {engine.quantization}, activations {args.activation_quantization}, "
            f"KV cache {args.kv_cache_dtype}, batch {args.batch}, context {args.context}, "
            f"dtype {engine.dtype}, attention "
            f"{engine.attention_backend.name}, threads {torch.get_num_threads()}, decode program "
            f"{engine.runner.decode_program_status} (ran {runs} of {steps} steps): {step_ms:.2f} ms per decode step "
            f"({1e3 * args.batch / step_ms:.1f} tok/s)")


def compare(args: argparse.Namespace) -> None:
    """Program on and off, alternating rounds of args.steps steps; medians and their ratio."""
    engines = {True: make_engine(args, True), False: make_engine(args, False)}
    times: dict[bool, list[float]] = {True: [], False: []}
    runs_before = program_runs(engines[True])
    for _ in range(args.rounds):
        for on, engine in engines.items():
            times[on].append(time_steps(engine, args.steps))
    median = {on: statistics.median(t) for on, t in times.items()}
    for on, engine in engines.items():
        runs = program_runs(engine) - (runs_before if on else 0)
        print(describe(engine, args, median[on], runs, args.steps * args.rounds))
    print(f"program on / off: {median[False] / median[True]:.2f}x faster per step (median of {args.rounds} "
          f"alternating rounds of {args.steps} steps)")


def phase_table(engine: LLMEngine, steps: int, step_ms: float) -> str:
    """Each kernel's share of a decode step: the program's phases run alone after each of `steps` steps
    (DecodeProgram.time_last_step), summed per kernel entry, the median over the steps."""
    per_step: dict[str, list[float]] = {}
    for _ in range(steps):
        engine.step()
        totals: dict[str, float] = {}
        for entry, seconds in engine.runner.decode_program.time_last_step():
            totals[entry] = totals.get(entry, 0.0) + seconds
        for entry, seconds in totals.items():
            per_step.setdefault(entry, []).append(1e3 * seconds)
    medians = {entry: statistics.median(ms) for entry, ms in per_step.items()}
    total = sum(medians.values())
    lines = ["| kernel entry | ms per step | share |", "|---|---|---|"]
    ranked = sorted(medians.items(), key=lambda e: -e[1])
    lines += [f"| {entry} | {ms:.1f} | {ms / total:.0%} |" for entry, ms in ranked]
    lines.append(f"phases run alone: {total:.1f} ms in all; the steps themselves (with the embedding, the head and the "
                 f"sampler outside the program): {step_ms:.1f} ms")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="default, a .gguf file or an HF-format directory")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--attention-backend", default="auto", choices=("auto", "mojo", "torch"))
    ap.add_argument("--quantization", default="auto", choices=QUANTIZATIONS)
    ap.add_argument("--activation-quantization", default="auto", choices=ACTIVATION_QUANTIZATIONS)
    ap.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
    ap.add_argument("--no-decode-program", action="store_true", help="every step through the modules")
    ap.add_argument("--compare-program", action="store_true", help="time the decode program on against off")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds for --compare-program")
    ap.add_argument("--no-profiler", action="store_true", help="only time the steps (for py-spy)")
    ap.add_argument("--phases", action="store_true",
                    help="instead of torch's profiler, each decode-program kernel's ms per step (its phases run alone)")
    ap.add_argument("--trace", help="also write a Chrome trace here")
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--threads", type=int, help="torch's (and so the kernels') threads; default: torch's choice")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.compare_program:
        compare(args)
        return

    engine = make_engine(args, not args.no_decode_program)
    runs_before = program_runs(engine)
    step_ms = time_steps(engine, args.steps)
    print(describe(engine, args, step_ms, program_runs(engine) - runs_before, args.steps))
    if args.no_profiler:
        return
    if args.phases:
        if program_runs(engine) == runs_before:
            raise SystemExit(f"the decode program did not run: {engine.runner.decode_program_status}")
        print(phase_table(engine, args.steps, step_ms))
        return
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            engine.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    if args.trace:
        prof.export_chrome_trace(args.trace)


if __name__ == "__main__":
    main()

"""Speculative decoding's speed: the engine with `--speculative-config` against the same engine without it,
in one process, at several concurrencies, on two workloads (loadtest/spec_workloads.py):

  grounded:   rewrite a 300-600-word text given in the prompt (the output quotes the input);
  open-ended: write a story (nothing to look up).

    python -m loadtest.bench_spec [--model PATH] [--concurrency 1 4 16] [--max-tokens 128] [--spec JSON]
    python -m loadtest.bench_spec --http [--model PATH.gguf] ...   # servers, against llama-server: bench_spec_serve

--model: an HF-format directory or a .gguf file (default: the default model; a random Qwen3-0.6B-shaped one
comes from `python -m loadtest.fixtures.make_gguf --shape qwen3-0.6b --type q4_k_m FILE`).

Prints generated tokens per second for both and their ratio, per workload and concurrency (greedy, the
same requests for both engines, whose outputs are also compared; each the best of --repeats runs,
alternated), and writes the same to loadtest/results/spec-inprocess-<model>.md. The c requests start
together and the batch ends with its last one. Nothing here asserts; it measures.
The goals the project set: >= 2x at concurrency 1 on grounded text, >= 1.3x at 16, >= 0.95x open-ended.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from loadtest.machine import cpu_name
from loadtest.spec_workloads import DEFAULT_SPEC, WORKLOADS, chat_text, model_dir
from shared.config import EngineConfig
from shared.default_model import DEFAULT_SERVED_NAME
from shared.sampling_params import SamplingParams
from worker.engine import LLMEngine

RESULTS = Path(__file__).resolve().parent / "results"


def run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    start = time.perf_counter()
    done = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    return seconds, [d.token_ids[0] for d in done]


def main() -> None:
    if "--http" in sys.argv[1:]:
        from loadtest import bench_spec_serve

        bench_spec_serve.main([a for a in sys.argv[1:] if a != "--http"])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="an HF-format directory or a .gguf (default: the default model)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--spec", default=json.dumps(DEFAULT_SPEC))
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, help="result file (default: loadtest/results/spec-inprocess-<model>.md)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    model = model_dir(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    plain = LLMEngine(EngineConfig(model=str(model)))
    spec = LLMEngine(EngineConfig(model=str(model), speculative_config=json.loads(args.spec)))
    lines = [f"model {model.name}, {cpu_name()}, speculative {spec.speculative}, greedy, max_tokens {args.max_tokens}"]
    print(lines[0], flush=True)
    for workload in args.workloads:
        for c in args.concurrency:
            prompts = [tokenizer.encode(chat_text(tokenizer, workload, i), add_special_tokens=False) for i in range(c)]
            run(plain, prompts[:1], 4)  # warm both (first-step costs) before timing
            run(spec, prompts[:1], 4)
            before = spec.speculator.counters.num_draft_tokens, spec.speculator.counters.num_accepted_tokens
            t_plain = t_spec = float("inf")
            for _ in range(args.repeats):  # alternated, best of each: other load on the machine only slows a run
                t, out_plain = run(plain, prompts, args.max_tokens)
                t_plain = min(t, t_plain)
                t, out_spec = run(spec, prompts, args.max_tokens)
                t_spec = min(t, t_spec)
            drafted = (spec.speculator.counters.num_draft_tokens - before[0]) // args.repeats
            accepted = (spec.speculator.counters.num_accepted_tokens - before[1]) // args.repeats
            n_plain, n_spec = sum(map(len, out_plain)), sum(map(len, out_spec))
            same = sum(a == b for a, b in zip(out_plain, out_spec))
            lines.append(f"{workload:10s} c={c:<3d} plain {n_plain / t_plain:7.1f} tok/s  spec {n_spec / t_spec:7.1f} "
                         f"tok/s  ratio {(n_spec / t_spec) / (n_plain / t_plain):5.2f}x  acceptance "
                         f"{accepted}/{drafted}  identical outputs {same}/{c}")
            print(lines[-1], flush=True)
    out = args.out or RESULTS / f"spec-inprocess-{args.model.stem if args.model else DEFAULT_SERVED_NAME}.md"
    out.write_text(f"# Speculative decoding in process against plain decoding, {model.name}\n\n"
                   f"`python -m loadtest.bench_spec {' '.join(sys.argv[1:])}`, best of {args.repeats}\n\n```\n"
                   + "\n".join(lines) + "\n```\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

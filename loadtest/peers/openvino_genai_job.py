"""Run by OpenVINO GenAI's venv python (loadtest/peers/openvino_genai.py starts it): reads a job as JSON on stdin
(model, prompts as token ids, levels, output_len, threads, requests_per_level), prints per level the output tok/s
of OpenVINO GenAI's fastest pipeline as one JSON line on stdout. Standard library and OpenVINO only: it runs
outside MILI's venv.

Its fastest at each concurrency c is measured rather than assumed, the better of two: LLMPipeline's stateful
(SDPA) model given the prompts in left-padded batches of c, one batch after another, and its continuous-batching
pipeline (paged KV, every request queued from the start, at most c scheduled at once, as a server would run it).
"""

from __future__ import annotations

import json
import sys
import time

KV_CACHE_GIB = 2  # the continuous-batching pipeline's KV cache, as vLLM's
BATCHED_TOKENS = 2048  # tokens one scheduler step may take (its default, 256, chops 128-token prompts); MILI's too


def _generation_config(ov_genai, output_len: int):
    config = ov_genai.GenerationConfig()
    config.max_new_tokens = output_len
    config.min_new_tokens = output_len
    config.ignore_eos = True
    config.do_sample = False  # greedy
    return config


def _ids(ids: list[int]):
    """One prompt as OpenVINO's input_ids tensor, [1, prompt_len] int64."""
    import numpy as np
    import openvino as ov

    return ov.Tensor(np.array([ids], dtype=np.int64))


def _padded(ov_genai, batch: list[list[int]]):
    """Prompts as one left-padded batch: TokenizedInputs of input_ids and attention_mask, [batch, longest] int64."""
    import numpy as np
    import openvino as ov

    width = max(map(len, batch))
    ids = np.zeros((len(batch), width), dtype=np.int64)
    mask = np.zeros((len(batch), width), dtype=np.int64)
    for row, prompt in enumerate(batch):
        ids[row, width - len(prompt):] = prompt
        mask[row, width - len(prompt):] = 1
    return ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(mask))


def _properties(threads: int) -> dict:
    return {"INFERENCE_NUM_THREADS": threads}


def _time_stateful(ov_genai, model: str, prompts: list[list[int]], output_len: int, threads: int,
                   concurrency: int) -> float:
    """LLMPipeline with its stateful SDPA model, the prompts in batches of `concurrency` (left-padded), one batch
    after another; output tok/s."""
    pipe = ov_genai.LLMPipeline(model, "CPU", ATTENTION_BACKEND="SDPA", **_properties(threads))
    config = _generation_config(ov_genai, output_len)
    pipe.generate(_padded(ov_genai, [p[:16] for p in prompts[:concurrency]]), config)  # warm-up: compilation
    produced, t0 = 0, time.perf_counter()
    for i in range(0, len(prompts), concurrency):
        out = pipe.generate(_padded(ov_genai, prompts[i:i + concurrency]), config)
        produced += sum(len(t) for t in out.tokens)
    return produced / (time.perf_counter() - t0)


def _time_continuous(ov_genai, model: str, prompts: list[list[int]], output_len: int, threads: int,
                     concurrency: int) -> float:
    """ContinuousBatchingPipeline: every request queued at once, at most `concurrency` scheduled; output tok/s."""
    scheduler = ov_genai.SchedulerConfig()
    scheduler.max_num_seqs = concurrency
    scheduler.cache_size = KV_CACHE_GIB
    scheduler.max_num_batched_tokens = BATCHED_TOKENS
    pipe = ov_genai.ContinuousBatchingPipeline(model, scheduler, "CPU", _properties(threads))
    config = _generation_config(ov_genai, output_len)
    pipe.generate([_ids(prompts[0][:16])], [config])  # warm-up
    t0 = time.perf_counter()
    results = pipe.generate([_ids(ids) for ids in prompts], [config] * len(prompts))
    elapsed = time.perf_counter() - t0
    produced = sum(len(ids) for r in results for ids in r.m_generation_ids)
    return produced / elapsed


# The CPU plugin's precision defaults, which it picks per CPU: recorded beside the results, since a comparison is
# like for like only where MILI runs the same arithmetic (int8 activations in groups of 32, an int8 KV cache).
CPU_PROPERTIES = ("INFERENCE_PRECISION_HINT", "DYNAMIC_QUANTIZATION_GROUP_SIZE", "KEY_CACHE_PRECISION",
                  "VALUE_CACHE_PRECISION")


def _cpu_properties() -> dict:
    import openvino as ov

    core = ov.Core()
    return {name: str(core.get_property("CPU", name)) for name in CPU_PROPERTIES}


def main() -> None:
    import openvino_genai as ov_genai

    job = json.loads(sys.stdin.read())
    out = {"levels": {}, "cpu_properties": _cpu_properties()}
    for c in job["levels"]:
        prompts = job["prompts"][:job["requests_per_level"] * c]
        runs = {"continuous batching": _time_continuous(ov_genai, job["model"], prompts, job["output_len"],
                                                        job["threads"], c),
                "stateful LLMPipeline": _time_stateful(ov_genai, job["model"], prompts, job["output_len"],
                                                       job["threads"], c)}
        best = max(runs, key=runs.get)
        out["levels"][str(c)] = {"output_throughput": runs[best], "pipeline": best, "all": runs,
                                 "requests": len(prompts)}
        print(f"  openvino-genai c={c:<3} {runs[best]:8.1f} tok/s ({best})", file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

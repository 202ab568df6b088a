"""MILI's engine measured for the GPU benchmark: single-stream decode, offline throughput in the manner of
nano-vllm's bench.py, and time to first token. Every request is greedy with ignore_eos, so it produces exactly its
max_tokens; every prompt is fresh random tokens, so no measurement is helped by the prefix cache. Each loop stops at
a deadline (time.perf_counter()) rather than overrun the benchmark's budget, and says so.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass

from shared.sampling_params import SamplingParams


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]


def offline_workload(n: int, lo: int, hi: int, vocab: int, seed: int) -> Workload:
    """bench.py's: prompt and output lengths uniform in lo..hi, random prompt tokens."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
    return Workload(prompts, [rng.randint(lo, hi) for _ in range(n)])


def random_prompt(length: int, vocab: int, rng: random.Random) -> list[int]:
    return [rng.randrange(vocab) for _ in range(length)]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _abort_all(engine, ids) -> None:
    for rid in ids:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()


def _abort_on_failure(engine, ids) -> None:
    """After a failed step: the next part gets the engine without these requests (no step taken here: the
    aborts are reported by the next part's first step)."""
    for rid in ids:
        engine.abort_request(rid)


def warm_up(engine, vocab: int, rng: random.Random, batch: int) -> None:
    """One short request, then `batch` at once: the first kernels, allocations and any lazily captured decode
    graphs happen here, not in a timed part."""
    engine.generate([random_prompt(16, vocab, rng)], greedy(8))
    engine.generate([random_prompt(16, vocab, rng) for _ in range(batch)], greedy(8))


def single_stream(engine, prompt: list[int], output_len: int, deadline: float) -> dict:
    """Decode tokens/s of one request, timed from its first token (the prefill's) to its last."""
    rid = f"single-{len(prompt)}"
    engine.add_request(rid, prompt, greedy(output_len))
    tokens, first, last = 0, None, None
    try:
        while engine.has_unfinished_requests():
            if time.perf_counter() > deadline:
                _abort_all(engine, [rid])
                break
            new = sum(len(o.new_token_ids) for o in engine.step())
            if new:
                last = time.perf_counter()
                first = last if first is None else first
                tokens += new
    except BaseException:
        _abort_on_failure(engine, [rid])
        raise
    decode_s = (last - first) if first is not None else 0.0
    return {"context": len(prompt), "output_tokens": tokens, "decode_s": decode_s, "complete": tokens == output_len,
            "tok_s": (tokens - 1) / decode_s if decode_s > 0 else None}


def time_to_first_token(engine, prompts: list[list[int]], deadline: float) -> dict:
    """From add_request to the step that returns the first token, the engine idle before each; the median."""
    times = []
    for i, prompt in enumerate(prompts):
        if time.perf_counter() > deadline:
            break
        rid = f"ttft-{i}"
        t0 = time.perf_counter()
        try:
            engine.add_request(rid, prompt, greedy(1))
            while not any(o.new_token_ids for o in engine.step()):
                pass
        except BaseException:
            _abort_on_failure(engine, [rid])
            raise
        times.append((time.perf_counter() - t0) * 1e3)
        _abort_all(engine, [rid])
    return {"prompt_tokens": len(prompts[0]), "runs": len(times), "ms": times,
            "median_ms": statistics.median(times) if times else None}


def offline(engine, workload: Workload, deadline: float) -> dict:
    """All requests added at once, then stepped to the end: output (and total) tokens/s over the whole run."""
    ids = [f"offline-{i}" for i in range(len(workload.prompts))]
    mine = set(ids)
    produced: Counter[str] = Counter()
    finish: Counter[str] = Counter()
    preemptions = engine.stats().num_preemptions
    stopped = None
    start = time.perf_counter()
    try:
        for rid, prompt, n in zip(ids, workload.prompts, workload.output_lens):
            engine.add_request(rid, prompt, greedy(n))
        while engine.has_unfinished_requests():
            if time.perf_counter() > deadline:
                stopped = f"budget: stopped after {sum(produced.values())} of {sum(workload.output_lens)} tokens"
                _abort_all(engine, ids)
                break
            for out in engine.step():
                if out.request_id not in mine:
                    continue  # an earlier failed part's aborted request, reported now
                produced[out.request_id] += len(out.new_token_ids)
                if out.finish_reason is not None:
                    finish[out.finish_reason] += 1
    except BaseException:
        _abort_on_failure(engine, ids)
        raise
    elapsed = time.perf_counter() - start
    out_tokens = sum(produced.values())
    prompt_tokens = sum(map(len, workload.prompts))
    return {"sequences": len(ids), "prompt_tokens": prompt_tokens, "output_tokens": out_tokens,
            "requested_output_tokens": sum(workload.output_lens),
            "every_request_got_its_tokens": all(produced[r] == n for r, n in zip(ids, workload.output_lens)),
            "finish_reasons": dict(finish), "preemptions": engine.stats().num_preemptions - preemptions,
            "seconds": elapsed, "complete": stopped is None, "stopped": stopped,
            "output_tok_s": out_tokens / elapsed, "total_tok_s": (out_tokens + prompt_tokens) / elapsed}

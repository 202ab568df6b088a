"""What the KV cache audit costs per engine step, on the default model with a 1 GiB cache.

    python -m loadtest.bench_kv_audit [--batch 32] [--context 512] [--steps 30]

Fills the cache with `batch` decoding requests of `context` tokens (the cache holds about 2,900 blocks
of 16 tokens), then times decode steps with the audit off and on, and the audit alone on that state
and on a cache whose every block is held. Prints the audit's cost as a share of a step.
"""

from __future__ import annotations

import argparse
import time

from loadtest.bench_engine import make_prompts
from shared.config import EngineConfig
from shared.default_model import default_model_path
from shared.sampling_params import SamplingParams
from worker.core.block_manager import BlockManager
from worker.core.kv_audit import KV_AUDIT_EVERY_STEPS, KvAuditor
from worker.core.sequence import Sequence
from worker.engine import LLMEngine
from worker.runner.sampler import make_generator


def _time_steps(engine: LLMEngine, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return (time.perf_counter() - start) / steps


def _time_audit(engine: LLMEngine, repeats: int) -> float:
    seqs = list(engine._live_sequences())
    start = time.perf_counter()
    for _ in range(repeats):
        report = engine.kv_audit.check(seqs)
    elapsed = (time.perf_counter() - start) / repeats
    assert report.ok, report.problems
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()

    engine = LLMEngine(EngineConfig(model=str(default_model_path()), kv_cache_memory=1 << 30, max_model_len=2048))
    bm = engine.block_manager
    params = SamplingParams(temperature=0.0, max_tokens=4 * args.steps + 8, ignore_eos=True)
    for i, prompt in enumerate(make_prompts(args.batch, args.context, args.context, engine.model_config.vocab_size,
                                            seed=1)):
        engine.add_request(f"r{i}", prompt, params)
    while any(s.num_output_tokens == 0 for s in engine._live_sequences()):
        engine.step()  # prefill everything first: only decode steps are timed
    print(f"{bm.num_blocks} KV blocks, {bm.num_used_blocks} held by {args.batch} requests of {args.context} tokens")

    engine.kv_audit.every_steps = 10**9  # off
    off = _time_steps(engine, args.steps)
    engine.kv_audit.every_steps = 1
    on = _time_steps(engine, args.steps)
    audit = _time_audit(engine, 200)

    # Worst case for the audit: every block held (one table covering the whole cache).
    full = BlockManager(bm.num_blocks, bm.block_size)
    hog = Sequence("hog", 0, [1] * (bm.num_blocks * bm.block_size - 1), params, 1, make_generator(0))
    full.allocate(hog, hog.num_tokens)
    auditor = KvAuditor(full)
    start = time.perf_counter()
    for _ in range(200):
        assert auditor.check([hog]).ok
    audit_full = (time.perf_counter() - start) / 200

    print(f"decode step, batch {args.batch}: {off * 1e3:.2f} ms without the audit, "
          f"{on * 1e3:.2f} ms auditing every step")
    print(f"audit alone: {audit * 1e6:.0f} us on this state ({audit / off:.2%} of a step); "
          f"{audit_full * 1e6:.0f} us with all {bm.num_blocks} blocks held ({audit_full / off:.2%})")
    print(f"served every {KV_AUDIT_EVERY_STEPS} steps: at most {audit_full / KV_AUDIT_EVERY_STEPS / off:.3%} "
          "of the engine's time at this batch")


if __name__ == "__main__":
    main()

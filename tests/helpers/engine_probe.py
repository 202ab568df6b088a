"""Runs an LLMEngine while recording the logits of every sampling row, then checks them against
transformers' forward pass over each request's final tokens (the oracle)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shared.config import EngineConfig
from shared.sampling_params import SamplingParams
from worker.engine import LLMEngine


@dataclass
class ProbedRun:
    engine: LLMEngine
    # request_id -> list of (position predicted, logits row [vocab])
    logits: dict[str, list[tuple[int, torch.Tensor]]] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)  # prompt + output per request


def make_engine(model_dir, **overrides) -> LLMEngine:
    cfg = dict(model=str(model_dir), dtype="float32", attention_backend="torch", num_kv_blocks=256,
               block_size=16, max_model_len=512)
    cfg.update(overrides)
    return LLMEngine(EngineConfig(**cfg))


def probe(engine: LLMEngine) -> dict[str, list[tuple[int, torch.Tensor]]]:
    """Wrap the model runner so every sampling row's logits are recorded with the position they predict."""
    records: dict[str, list[tuple[int, torch.Tensor]]] = {}
    runner = engine.runner
    original_execute = runner.execute
    batches = []
    original_schedule = engine.scheduler.schedule

    def schedule():
        batch = original_schedule()
        batches.append(batch)
        return batch

    def execute(inputs):
        result = original_execute(inputs)
        batch = batches[-1]
        for row, i in enumerate(inputs.sampling_rows):
            seq = batch.seqs[i]
            records.setdefault(seq.request_id, []).append((seq.num_tokens, result.logits[row].clone()))
        return result

    engine.scheduler.schedule = schedule
    runner.execute = execute
    return records


def run_greedy(engine: LLMEngine, prompts: list[list[int]], max_tokens: int, check_blocks: bool = True,
               stagger: int = 0) -> ProbedRun:
    """Greedy, EOS ignored. stagger > 0 adds one request every `stagger` steps instead of all at once."""
    records = probe(engine)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    run = ProbedRun(engine, records)
    pending = [(f"req-{i}", p) for i, p in enumerate(prompts)]
    outputs: dict[str, list[int]] = {rid: [] for rid, _ in pending}
    finished: set[str] = set()
    prompts_by_id = dict(pending)
    step = 0
    while pending or len(finished) < len(prompts):
        if pending and (stagger == 0 or step % stagger == 0):
            batch_size = len(pending) if stagger == 0 else 1
            for rid, prompt in pending[:batch_size]:
                engine.add_request(rid, prompt, params)
            pending = pending[batch_size:]
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
            if out.finish_reason is not None:
                assert out.finish_reason == "length", out
                finished.add(out.request_id)
        if check_blocks:
            engine.block_manager.check_invariants()
        step += 1
        assert step < 10_000, "engine made no progress"
    for rid, out in outputs.items():
        assert len(out) == max_tokens, (rid, len(out))
        run.tokens[rid] = prompts_by_id[rid] + out
    return run


def assert_matches_reference(run: ProbedRun, hf_model, rtol: float = 1e-4, atol: float = 1e-4) -> None:
    """Every recorded logits row equals transformers' at the same position, and every greedy token is the
    reference argmax there (so the whole continuation equals transformers' greedy decoding), or ties it within the
    same bound: a random model now and then has two logits a float32 rounding apart (seed 2083911516: 1.4e-6), where
    either pick agrees with transformers as far as the logits can. The reference runs on the engine's own tokens,
    so every position after such a tie is still checked."""
    device = next(hf_model.parameters()).device  # the reference runs where the caller put it
    for rid, tokens in run.tokens.items():
        with torch.no_grad():
            ref = hf_model(torch.tensor([tokens], device=device)).logits[0].float()  # [len, vocab]
        rows = run.logits[rid]
        num_prompt = len(tokens) - len(rows)
        assert [pos for pos, _ in rows] == list(range(num_prompt, len(tokens))), rid
        for pos, ours in rows:
            expected = ref[pos - 1]
            torch.testing.assert_close(ours.to(device), expected, rtol=rtol, atol=atol,
                                       msg=lambda m: f"{rid} position {pos}: {m}")
            best = expected.max()
            tied = best - expected[tokens[pos]] <= atol + rtol * best.abs()
            assert tokens[pos] == int(expected.argmax()) or tied, f"{rid}: greedy token differs at position {pos}"


def assert_follows_reference_within(run: ProbedRun, hf_model, logit_bound: float, min_agreement: float) -> None:
    """A lossy setting's stated bound (a reduced-precision KV cache): every recorded logits row within logit_bound of
    the largest reference logit at that position, and the greedy picks equal to the reference's argmax at no less
    than min_agreement of the positions. The reference runs on the engine's own tokens."""
    agree = total = 0
    for rid, tokens in run.tokens.items():
        with torch.no_grad():
            ref = hf_model(torch.tensor([tokens])).logits[0].float()
        for pos, ours in run.logits[rid]:
            expected = ref[pos - 1]
            assert (ours - expected).abs().max() <= logit_bound * expected.abs().max(), f"{rid} position {pos}"
            agree += int(ours.argmax()) == int(expected.argmax())
            total += 1
    assert agree >= min_agreement * total, f"argmax agreement {agree}/{total}"

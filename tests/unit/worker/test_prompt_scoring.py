"""Prompt scoring in the engine: prompt logprobs against transformers (float32, tiny random models) through
chunked prefill, preemption and prefix-cache hits; max_tokens 0; and stopping one choice of n alone.

Tolerance: logprobs within 1e-4 (absolute and relative) of transformers' float32 log_softmax, the bound the
engine's logit parity tests use.
"""

from __future__ import annotations

import random

import pytest
import torch

from shared.sampling_params import SamplingParams, SamplingParamsError
from tests.helpers.engine_probe import make_engine
from tests.helpers.tiny_models import build_tiny_model
from tests.unit.worker.test_engine_api import drain

VOCAB = 320
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(params=["qwen3", "llama"])
def model(request, tmp_path, test_seed):
    model_dir = tmp_path / request.param
    return model_dir, build_tiny_model(request.param, test_seed, model_dir, vocab_size=VOCAB)


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def collect(engine, limit: int = 5000) -> dict[str, dict]:
    """Step until idle; per request: prompt logprobs (with the output index that carried them), choices."""
    results: dict[str, dict] = {}
    for _ in range(limit):
        if not engine.has_unfinished_requests():
            return results
        for out in engine.step():
            r = results.setdefault(out.request_id, {"prompt": None, "carrier": None, "tokens": {}, "finish": {},
                                                    "cached": {}})
            if out.prompt_logprobs is not None:
                assert r["prompt"] is None, "prompt logprobs sent twice"
                r["prompt"], r["carrier"] = out.prompt_logprobs, out.index
            r["tokens"].setdefault(out.index, []).extend(out.new_token_ids)
            r["cached"][out.index] = out.num_cached_tokens
            if out.finish_reason:
                r["finish"][out.index] = out.finish_reason
        engine.block_manager.check_invariants()
    raise AssertionError("engine did not finish")


def assert_scores_prompt(entries, tokens: list[int], hf_model, k: int) -> None:
    """entries[i] is prompt token i + 1's logprob, rank and top-k, as transformers computes them."""
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([tokens])).logits[0].float(), dim=-1)  # [len, vocab]
    assert len(entries) == len(tokens) - 1
    ours = torch.tensor([e.logprob for e in entries])
    expected = ref[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:], dtype=torch.long)]
    torch.testing.assert_close(ours, expected, **TOL)
    for i, e in enumerate(entries):
        row, value = ref[i], float(expected[i])
        assert e.token_id == tokens[i + 1]
        # The rank is exact up to ties within the tolerance.
        assert int((row > value + 1e-4).sum()) + 1 <= e.rank <= int((row >= value - 1e-4).sum()), (i, e.rank)
        assert len(e.top) == k
        if k:
            top = torch.topk(row, k)
            torch.testing.assert_close(torch.tensor([v for _, v in e.top]), top.values, **TOL)
            # Ids agree except where neighbouring values tie within the tolerance.
            for (tid, _), want, want_v in zip(e.top, top.indices.tolist(), top.values.tolist()):
                assert tid == want or abs(float(row[tid]) - want_v) < 1e-4


@pytest.mark.parametrize("batched_tokens", [2048, 7])
def test_prompt_logprobs_match_transformers(model, test_seed, batched_tokens):
    """Whole prompts and tiny prefill chunks, beside requests that do not score, with and without output."""
    model_dir, hf_model = model
    engine = make_engine(model_dir, max_num_batched_tokens=batched_tokens, block_size=8)
    prompts = {f"p{i}": prompt(test_seed + i, n) for i, n in enumerate([1, 2, 9, 33, 70])}
    ks = {"p0": 3, "p1": 0, "p2": 5, "p3": 20, "p4": 1}
    for rid, p in prompts.items():
        engine.add_request(rid, p, SamplingParams(temperature=0.0, max_tokens=4 if rid != "p3" else 0,
                                                  prompt_logprobs=ks[rid], ignore_eos=True))
        engine.add_request(f"plain-{rid}", p, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    results = collect(engine)
    for rid, p in prompts.items():
        r = results[rid]
        assert r["carrier"] == 0
        assert_scores_prompt(r["prompt"], p, hf_model, ks[rid])
        if rid == "p3":  # max_tokens 0: scored, nothing generated
            assert r["tokens"] == {0: []} and r["finish"] == {0: "length"}
        else:  # scoring leaves generation alone
            assert r["tokens"][0] == results[f"plain-{rid}"]["tokens"][0][:4]
        assert results[f"plain-{rid}"]["prompt"] is None
    assert engine.block_manager.num_used_blocks == 0


def test_prompt_logprobs_survive_preemption(model, test_seed):
    model_dir, hf_model = model
    # 10 blocks of 8 tokens: the three requests cannot all stay resident, so someone is recomputed.
    engine = make_engine(model_dir, block_size=8, num_kv_blocks=10, max_model_len=80, max_num_batched_tokens=16)
    prompts = {f"p{i}": prompt(test_seed + i, n) for i, n in enumerate([30, 41, 25])}
    for rid, p in prompts.items():
        engine.add_request(rid, p, SamplingParams(temperature=0.0, max_tokens=30, prompt_logprobs=2,
                                                  ignore_eos=True))
    results = collect(engine)
    assert engine.scheduler.num_preemptions > 0
    for rid, p in prompts.items():
        assert_scores_prompt(results[rid]["prompt"], p, hf_model, 2)
        assert len(results[rid]["tokens"][0]) == 30


def test_scoring_skips_prefix_hits_without_disturbing_the_cache(model, test_seed):
    model_dir, hf_model = model
    engine = make_engine(model_dir, block_size=8)
    shared = prompt(test_seed, 40)  # 5 full blocks
    greedy = dict(temperature=0.0, max_tokens=3, ignore_eos=True)
    engine.add_request("warm", shared + [7], SamplingParams(**greedy))
    collect(engine)
    queries, hits = engine.scheduler.prefix_query_tokens, engine.scheduler.prefix_hit_tokens
    cached_before = engine.block_manager.num_cached_free_blocks

    # A scoring request over the cached prefix computes every position itself, beside one that hits the cache.
    scored_prompt = shared + prompt(test_seed + 1, 12)
    engine.add_request("scored", scored_prompt, SamplingParams(prompt_logprobs=4, **greedy))
    engine.add_request("hit", shared + [9, 10], SamplingParams(**greedy))
    r = collect(engine)
    assert r["scored"]["cached"][0] == 0
    assert_scores_prompt(r["scored"]["prompt"], scored_prompt, hf_model, 4)
    assert r["hit"]["cached"][0] == 40
    # The scoring request was no prefix-cache query; the other one hit all 40 tokens.
    assert engine.scheduler.prefix_query_tokens - queries == 42
    assert engine.scheduler.prefix_hit_tokens - hits == 40
    # The cached prefix is still there, and the scored prompt's own new full blocks were added for others.
    assert engine.block_manager.num_cached_free_blocks > cached_before
    engine.add_request("after", scored_prompt + [11], SamplingParams(**greedy))
    assert collect(engine)["after"]["cached"][0] == 48  # all 6 full blocks of the scored prompt
    engine.block_manager.check_invariants()


def test_max_tokens_zero(model, test_seed):
    model_dir, hf_model = model
    engine = make_engine(model_dir, block_size=8, max_model_len=64, num_kv_blocks=8)
    p = prompt(test_seed, 20)
    # Without prompt logprobs there is nothing to compute: finished before any step runs the model.
    engine.add_request("nothing", p, SamplingParams(max_tokens=0, n=2))
    outs = engine.step()
    assert sorted((o.index, o.finish_reason, o.new_token_ids) for o in outs) == [(0, "length", []), (1, "length", [])]
    assert not engine.has_unfinished_requests()
    # n > 1: choice 0 scores, the other choices end with it; a prompt may fill the whole context.
    full = prompt(test_seed + 1, 64)
    engine.add_request("n3", full, SamplingParams(max_tokens=0, n=3, prompt_logprobs=1))
    r = collect(engine)["n3"]
    assert r["finish"] == {0: "length", 1: "length", 2: "length"} and r["tokens"] == {0: [], 1: [], 2: []}
    assert r["carrier"] == 0
    assert_scores_prompt(r["prompt"], full, hf_model, 1)
    assert engine.block_manager.num_used_blocks == 0


def test_limits():
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(prompt_logprobs=21)
    assert e.value.param == "prompt_logprobs"
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(prompt_logprobs=-1)
    assert e.value.param == "prompt_logprobs"
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(max_tokens=-1)
    assert e.value.param == "max_tokens"


def test_abort_one_choice_frees_its_blocks_and_leaves_the_others(model, test_seed):
    model_dir, _ = model
    # top_k keeps the seeded draws independent of float rounding that differs with the batch's shape.
    params = SamplingParams(n=3, temperature=1.0, top_k=20, max_tokens=40, seed=test_seed, ignore_eos=True)
    p = prompt(test_seed, 13)
    reference = make_engine(model_dir, block_size=8)
    reference.add_request("r", p, params)
    expected = collect(reference)["r"]["tokens"]

    engine = make_engine(model_dir, block_size=8)
    engine.add_request("r", p, params)
    victim = engine._requests["r"][1]
    while victim.num_output_tokens < 3:
        engine.step()
    private = [b for b in victim.block_table if engine.block_manager.blocks[b].ref_count == 1]
    used = engine.block_manager.num_used_blocks
    engine.abort_choice("r", 1)
    # Freed at once, and the sequence no longer runs.
    assert victim.block_table == [] and victim.is_finished and victim not in engine.scheduler.running
    assert engine.block_manager.num_used_blocks == used - len(private)
    steps = 0
    partial = {i: [] for i in range(3)}
    finish = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            partial[out.index] += out.new_token_ids
            if out.finish_reason:
                finish[out.index] = out.finish_reason
        steps += 1
    assert finish == {0: "length", 1: "abort", 2: "length"}
    assert partial[1] == []  # nothing after the abort
    for i in (0, 2):
        assert expected[i][-len(partial[i]):] == partial[i] and len(partial[i]) > 30
    engine.abort_choice("r", 0)  # finished requests are ignored
    assert engine.block_manager.num_used_blocks == 0


def test_abort_leader_before_prefill_promotes_a_parked_choice(model, test_seed):
    model_dir, hf_model = model
    engine = make_engine(model_dir, block_size=8, max_num_batched_tokens=8)
    p = prompt(test_seed, 30)
    params = SamplingParams(n=3, temperature=0.0, max_tokens=5, prompt_logprobs=2, ignore_eos=True)
    engine.add_request("r", p, params)
    engine.step()  # the first 8 prompt tokens of choice 0
    engine.abort_choice("r", 0)
    engine.abort_choice("r", 2)  # still parked
    r = collect(engine)["r"]
    assert r["finish"] == {0: "abort", 1: "length", 2: "abort"}
    assert r["carrier"] == 1  # the promoted choice scored the prompt
    assert_scores_prompt(r["prompt"], p, hf_model, 2)
    alone = make_engine(model_dir, block_size=8)
    alone.add_request("alone", p, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    assert r["tokens"][1] == collect(alone)["alone"]["tokens"][0]
    assert engine.block_manager.num_used_blocks == 0

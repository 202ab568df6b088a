"""The engine's in-process API: admission checks, aborts in every state, n > 1, seeds, stop conditions."""

from __future__ import annotations

import random

import pytest
import torch

from shared.sampling_params import SamplingParams
from tests.helpers.engine_probe import make_engine
from tests.helpers.tiny_models import build_tiny_model
from worker.outputs import RequestRejected

VOCAB = 320
EOS = 2


@pytest.fixture
def model(tmp_path, test_seed):
    model_dir = tmp_path / "qwen3"
    hf_model = build_tiny_model("qwen3", test_seed, model_dir, vocab_size=VOCAB)
    return model_dir, hf_model


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def drain(engine, limit: int = 2000) -> dict[tuple[str, int], dict]:
    """Step until idle; per (request, choice): tokens, finish reason, cached tokens, logprobs."""
    results: dict[tuple[str, int], dict] = {}
    for _ in range(limit):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            r = results.setdefault((out.request_id, out.index),
                                   {"tokens": [], "finish": None, "cached": 0, "logprobs": [], "stop_id": None})
            r["tokens"] += out.new_token_ids
            r["logprobs"] += out.logprobs or []
            r["cached"] = out.num_cached_tokens
            if out.finish_reason:
                r["finish"], r["stop_id"] = out.finish_reason, out.stop_token_id
        engine.block_manager.check_invariants()
    else:
        raise AssertionError("engine did not finish")
    return results


def test_rejects_what_can_never_fit(model):
    model_dir, _ = model
    with pytest.raises(ValueError, match="does not fit the KV cache"):
        make_engine(model_dir, max_model_len=64, num_kv_blocks=3, block_size=16)
    engine = make_engine(model_dir, max_model_len=64, num_kv_blocks=4, block_size=16)
    with pytest.raises(RequestRejected, match=r"length is 64 tokens. Input tokens exceed the configured limit of "
                                              r"54 tokens: you requested 70 tokens \(60 in the prompt, 10 in "
                                              r"max_tokens\)"):
        engine.add_request("a", [5] * 60, SamplingParams(max_tokens=10))
    with pytest.raises(RequestRejected, match="context length is 64"):
        engine.add_request("b", [5] * 64, SamplingParams())
    with pytest.raises(RequestRejected, match="outside the vocabulary"):
        engine.add_request("d", [5, VOCAB], SamplingParams(max_tokens=2))
    with pytest.raises(RequestRejected, match="outside the vocabulary"):
        engine.add_request("e", [5], SamplingParams(max_tokens=2, logit_bias={VOCAB + 1: 1.0}))
    with pytest.raises(RequestRejected, match="empty"):
        engine.add_request("f", [], SamplingParams(max_tokens=2))
    engine.add_request("ok", [5] * 10, SamplingParams(max_tokens=5))
    with pytest.raises(RequestRejected, match="already in use"):
        engine.add_request("ok", [5] * 10, SamplingParams(max_tokens=5))
    # Without max_tokens the request may run to the end of the context.
    engine.add_request("to-the-end", [5] * 10, SamplingParams(temperature=0.0, ignore_eos=True))
    results = drain(engine)
    assert results[("ok", 0)]["finish"] in ("stop", "length")
    assert len(results[("to-the-end", 0)]["tokens"]) == 64 - 10
    assert results[("to-the-end", 0)]["finish"] == "length"


@pytest.mark.parametrize("state", ["waiting", "prefilling", "decoding"])
def test_abort_frees_blocks_in_every_state(model, state, test_seed):
    model_dir, _ = model
    engine = make_engine(model_dir, max_num_batched_tokens=16, max_num_seqs=1, block_size=8)
    greedy = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    engine.add_request("busy", prompt(test_seed, 40), greedy)
    engine.add_request("victim", prompt(test_seed + 1, 40), greedy)
    if state == "waiting":
        engine.step()  # "busy" holds the only running slot
        victim_seq = engine._requests["victim"][0]
        assert victim_seq in engine.scheduler.waiting
    else:
        engine.abort_request("busy")
        engine.step()  # victim's first 16-token chunk
        victim_seq = engine._requests["victim"][0]
        if state == "decoding":
            while victim_seq.num_output_tokens < 3:
                engine.step()
        else:
            assert 0 < victim_seq.num_computed_tokens < victim_seq.num_prompt_tokens
    used_before = engine.block_manager.num_used_blocks
    held = len(victim_seq.block_table)
    assert (held == 0) == (state == "waiting")
    engine.abort_request("victim")
    assert victim_seq.block_table == []
    assert engine.block_manager.num_used_blocks == used_before - held
    engine.block_manager.check_invariants()
    outs = [o for o in engine.step() if o.request_id == "victim"]
    assert len(outs) == 1 and outs[0].finish_reason == "abort" and outs[0].new_token_ids == []
    engine.abort_request("busy")
    drain(engine)
    assert engine.block_manager.num_used_blocks == 0
    engine.abort_request("victim")  # aborting a finished request is harmless


def test_n_choices_share_prompt_blocks_and_differ(model, test_seed):
    model_dir, _ = model
    engine = make_engine(model_dir, block_size=8)
    p = prompt(test_seed, 43)  # 5 full blocks + 3 tokens
    engine.add_request("multi", p, SamplingParams(n=4, temperature=1.5, max_tokens=12, seed=test_seed,
                                                  ignore_eos=True))
    results = drain(engine)
    assert sorted(results) == [("multi", i) for i in range(4)]
    assert all(len(r["tokens"]) == 12 and r["finish"] == "length" for r in results.values())
    # Choices 1..3 reuse choice 0's five full prompt blocks.
    assert [results[("multi", i)]["cached"] for i in range(4)] == [0, 40, 40, 40]
    assert len({tuple(r["tokens"]) for r in results.values()}) > 1
    assert engine.block_manager.num_used_blocks == 0


def test_seeded_request_independent_of_batch(model, test_seed):
    model_dir, _ = model
    # float32 matmuls round differently with the batch's shape, and a draw can land within that of a CDF step.
    # q8_0's integer kernels and the Mojo attention give a row the same bits whatever the batch holds, so the
    # request run alone is an exact reference.
    exact = dict(quantization="q8_0", attention_backend="mojo")
    params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=20, seed=test_seed, ignore_eos=True)
    alone = make_engine(model_dir, **exact)
    alone.add_request("x", prompt(test_seed, 11), params)
    solo = drain(alone)[("x", 0)]["tokens"]

    crowded = make_engine(model_dir, max_num_batched_tokens=9, **exact)
    for i in range(5):
        crowded.add_request(f"other-{i}", prompt(test_seed + 10 + i, 3 + 7 * i),
                            SamplingParams(temperature=0.8, max_tokens=25, ignore_eos=True))
    crowded.add_request("x", prompt(test_seed, 11), params)
    assert drain(crowded)[("x", 0)]["tokens"] == solo


def test_stop_token_ids_min_tokens_and_eos(model, test_seed):
    model_dir, hf_model = model
    engine = make_engine(model_dir)
    p = prompt(test_seed, 9)
    engine.add_request("free", p, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    free = drain(engine)[("free", 0)]["tokens"]
    stop_at = free[4]
    first = free.index(stop_at)
    engine.add_request("stopped", p, SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_at],
                                                    ignore_eos=True))
    stopped = drain(engine)[("stopped", 0)]
    assert stopped["tokens"] == free[:first + 1] and stopped["finish"] == "stop"
    assert stopped["stop_id"] == stop_at

    # Make EOS the greedy choice everywhere: the request stops at once unless ignore_eos or min_tokens.
    bias = {EOS: 100.0}
    engine.add_request("eos", p, SamplingParams(temperature=0.0, max_tokens=8, logit_bias=bias))
    engine.add_request("ignore", p, SamplingParams(temperature=0.0, max_tokens=8, logit_bias=bias, ignore_eos=True))
    engine.add_request("min", p, SamplingParams(temperature=0.0, max_tokens=8, logit_bias=bias, min_tokens=5))
    r = drain(engine)
    assert r[("eos", 0)]["tokens"] == [EOS] and r[("eos", 0)]["finish"] == "stop"
    assert r[("ignore", 0)]["tokens"] == [EOS] * 8 and r[("ignore", 0)]["finish"] == "length"
    assert len(r[("min", 0)]["tokens"]) == 6 and EOS not in r[("min", 0)]["tokens"][:5]
    assert r[("min", 0)]["tokens"][5] == EOS and r[("min", 0)]["finish"] == "stop"
    # The stop token that ended a choice, EOS included, is named (the Responses API leaves its logprob out).
    assert r[("eos", 0)]["stop_id"] == r[("min", 0)]["stop_id"] == EOS and r[("ignore", 0)]["stop_id"] is None


def test_logprobs_through_the_engine(model, test_seed):
    model_dir, hf_model = model
    engine = make_engine(model_dir)
    p = prompt(test_seed, 13)
    engine.add_request("lp", p, SamplingParams(temperature=0.0, max_tokens=6, logprobs=5, ignore_eos=True))
    r = drain(engine)[("lp", 0)]
    assert len(r["logprobs"]) == 6
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([p + r["tokens"]])).logits[0].float(), -1)
    for step, (token, lp) in enumerate(zip(r["tokens"], r["logprobs"])):
        row = ref[len(p) + step - 1]
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(float(row[token]), abs=1e-4)
        top = torch.topk(row, 5)
        assert [t for t, _ in lp.top] == top.indices.tolist()
        assert [v for _, v in lp.top] == pytest.approx(top.values.tolist(), abs=1e-4)

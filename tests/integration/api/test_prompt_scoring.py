"""Prompt scoring through the real server (tiny random Qwen3, float32): echo + logprobs with and without
generation, max_tokens 0, the lm-evaluation-harness loglikelihood request, vLLM's prompt_logprobs, streaming,
and bad inputs. Every logprob is checked against transformers' float32 log_softmax within 1e-4.

The shared server runs --max-num-batched-tokens 256, so the long prompts here are prefilled in chunks.
"""

from __future__ import annotations

import random

import httpx2
import openai
import pytest
import torch
from tokenizers import Tokenizer

from tests.helpers.sse import chunks, stream_lines
from tests.integration.conftest import SERVED_NAME

TOL = dict(abs=1e-4, rel=1e-4)
LONG_TEXT = " ".join(["The quick brown fox jumps over the lazy dog while the cat sleeps."] * 30)  # > 256 tokens


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """transformers on the served checkpoint (float32), and the served tokenizer."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    return model, Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


def ref_logprobs(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: row i is the distribution of token i + 1."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def post(server, path: str, body: dict) -> dict:
    r = httpx2.post(server.url + path, json={"model": SERVED_NAME, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_logprobs_max_tokens_zero_scores_the_prompt(client, reference):
    model, tok = reference
    ids = tok.encode(LONG_TEXT).ids
    assert len(ids) > 256
    # The prompt is in the prefix cache now; the scoring request below must still compute every position.
    client.completions.create(model=SERVED_NAME, prompt=LONG_TEXT, max_tokens=1)
    r = client.completions.create(model=SERVED_NAME, prompt=LONG_TEXT, echo=True, logprobs=3, max_tokens=0,
                                  temperature=0)
    choice = r.choices[0]
    assert choice.text == LONG_TEXT and choice.finish_reason == "length"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 0
    assert r.usage.total_tokens == len(ids)
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert "".join(lp.tokens) == LONG_TEXT
    assert lp.text_offset[0] == 0
    assert all(b - a == len(t) for a, b, t in zip(lp.text_offset, lp.text_offset[1:], lp.tokens))
    ref = ref_logprobs(model, ids)
    for i in range(1, len(ids)):
        row = ref[i - 1]
        assert lp.token_logprobs[i] == pytest.approx(float(row[ids[i]]), **TOL), i
        top = lp.top_logprobs[i]
        # The token itself and 3 alternatives; tokens that read alike share a key, which keeps the highest value.
        assert top[lp.tokens[i]] >= lp.token_logprobs[i]
        assert 1 <= len(top) <= 4
        assert max(top.values()) == pytest.approx(float(row.max()), **TOL)


def test_echo_logprobs_with_generation_cover_prompt_and_output(client, reference):
    model, tok = reference
    prompt = "Once upon a time there was"
    ids = tok.encode(prompt).ids
    r = client.completions.create(model=SERVED_NAME, prompt=prompt, echo=True, logprobs=2, max_tokens=5,
                                  temperature=0, extra_body={"ignore_eos": True})
    choice = r.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(prompt) and r.usage.completion_tokens == 5
    assert len(lp.tokens) == len(ids) + 5 and lp.token_logprobs[0] is None
    # The text skips special tokens a random model may generate; the logprobs still name every token.
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    assert "".join(t for t in lp.tokens if t not in special) == choice.text
    assert lp.text_offset[len(ids)] == len(prompt)  # the completion's offsets continue after the echo
    out_ids = [int(t) for t in ref_logprobs(model, ids).argmax(-1)[-1:]]  # greedy first output token
    full = ids + out_ids
    ref = ref_logprobs(model, full)
    for i in range(1, len(full)):
        assert lp.token_logprobs[i] == pytest.approx(float(ref[i - 1][full[i]]), **TOL), i


def test_lm_eval_harness_loglikelihood_request(server, reference):
    """The body lm-evaluation-harness's local-completions model sends for loglikelihood (token-id prompts,
    echo, logprobs 1, max_tokens 1, temperature 0, seed), parsed as it parses it: the continuation's
    logprob is sum(token_logprobs[ctxlen:-1]), greedy when each equals the max of its top_logprobs.
    And the older max_tokens 0 form, where nothing follows the prompt."""
    model, tok = reference
    rng = random.Random(7)
    context = tok.encode("Question: what colour is the sky? Answer:").ids
    greedy_cont = []
    for _ in range(4):
        greedy_cont.append(int(ref_logprobs(model, context + greedy_cont)[-1].argmax()))
    random_cont = [rng.randrange(100, 40000) for _ in range(4)]
    requests = [(context, greedy_cont), (context, random_cont)]
    body = {"prompt": [c + x for c, x in requests], "temperature": 0, "max_tokens": 1, "logprobs": 1,
            "seed": 1234, "echo": True}
    for max_tokens in (1, 0):
        out = post(server, "/v1/completions", {**body, "max_tokens": max_tokens})
        choices = sorted(out["choices"], key=lambda c: c["index"])
        assert len(choices) == 2
        assert out["usage"]["completion_tokens"] == 2 * max_tokens
        for choice, (ctx, cont) in zip(choices, requests):
            stop = len(choice["logprobs"]["token_logprobs"]) - max_tokens
            assert stop == len(ctx) + len(cont)
            token_lps = choice["logprobs"]["token_logprobs"][len(ctx):stop]
            tops = choice["logprobs"]["top_logprobs"][len(ctx):stop]
            ref = ref_logprobs(model, ctx + cont)
            expected = sum(float(ref[len(ctx) + j - 1][t]) for j, t in enumerate(cont))
            assert sum(token_lps) == pytest.approx(expected, **TOL)
            is_greedy = all(lp == max(top.values()) for lp, top in zip(token_lps, tops))
            ref_greedy = all(int(ref[len(ctx) + j - 1].argmax()) == t for j, t in enumerate(cont))
            assert is_greedy == ref_greedy
        assert [c["text"] for c in choices][0].startswith(tok.decode(context, skip_special_tokens=False))
    # The greedy continuation is greedy; the random one almost surely is not.
    assert all(int(ref_logprobs(model, context + greedy_cont[:j])[-1].argmax()) == greedy_cont[j] for j in range(4))


def test_prompt_of_the_whole_context_can_be_scored(server):
    ids = [random.Random(3).randrange(100, 40000) for _ in range(512)]  # the served context is 512
    out = post(server, "/v1/completions", {"prompt": ids, "echo": True, "logprobs": 0, "max_tokens": 0})
    assert len(out["choices"][0]["logprobs"]["token_logprobs"]) == 512
    assert out["usage"] == {"prompt_tokens": 512, "completion_tokens": 0, "total_tokens": 512,
                            "prompt_tokens_details": {"cached_tokens": 0}}
    # Without echo nothing would come back: as vLLM, max_tokens 0 needs echo.
    r = httpx2.post(server.url + "/v1/completions", json={"model": SERVED_NAME, "prompt": ids, "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_echo_without_logprobs_and_max_tokens_zero(client):
    r = client.completions.create(model=SERVED_NAME, prompt=["one two", "three"], echo=True, max_tokens=0, n=2)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == ["one two", "one two", "three", "three"]
    assert all(c.finish_reason == "length" and c.logprobs is None for c in r.choices)
    assert r.usage.completion_tokens == 0


def assert_vllm_prompt_logprobs(entries, ids: list[int], ref: torch.Tensor, k: int, tok) -> None:
    assert len(entries) == len(ids) and entries[0] is None
    for i in range(1, len(ids)):
        row, entry = ref[i - 1], entries[i]
        mine = entry[str(ids[i])]
        assert mine["logprob"] == pytest.approx(float(row[ids[i]]), **TOL)
        assert mine["decoded_token"] == tok.decode([ids[i]], skip_special_tokens=False)
        value = float(row[ids[i]])
        assert int((row > value + 1e-4).sum()) + 1 <= mine["rank"] <= int((row >= value - 1e-4).sum())
        top = sorted((v["rank"], v["logprob"]) for key, v in entry.items() if v["rank"] <= k)
        assert [r for r, _ in top][:k] == list(range(1, k + 1))
        assert [lp for _, lp in top][:k] == pytest.approx(torch.topk(row, k).values.tolist(), **TOL)
        assert len(entry) <= k + 1


def test_vllm_prompt_logprobs_on_completions_and_chat(server, reference):
    model, tok = reference
    prompt = "Scores for every token of this prompt"
    ids = tok.encode(prompt).ids
    out = post(server, "/v1/completions", {"prompt": prompt, "prompt_logprobs": 2, "max_tokens": 2, "n": 2,
                                           "temperature": 0})
    ref = ref_logprobs(model, ids)
    for choice in out["choices"]:
        assert choice["logprobs"] is None  # only what was asked for
        assert_vllm_prompt_logprobs(choice["prompt_logprobs"], ids, ref, 2, tok)
    assert out["choices"][0]["prompt_logprobs"] == out["choices"][1]["prompt_logprobs"]
    assert "prompt_logprobs" not in post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1})["choices"][0]

    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                                 "prompt_logprobs": 0, "max_tokens": 2})
    entries = chat["prompt_logprobs"]
    assert len(entries) == chat["usage"]["prompt_tokens"]
    assert all(len(e) == 1 for e in entries[1:])  # k = 0: the prompt token alone
    # The rendered chat prompt (ChatML: it opens with <|im_start|>, the rest are the entries' keys) is
    # scored like any prompt.
    chat_ids = [tok.token_to_id("<|im_start|>")] + [int(next(iter(e))) for e in entries[1:]]
    assert prompt in tok.decode(chat_ids, skip_special_tokens=False)
    assert_vllm_prompt_logprobs(entries, chat_ids, ref_logprobs(model, chat_ids), 0, tok)


def test_streaming_echo_with_logprobs_equals_non_streaming(server):
    body = {"prompt": "Streaming the prompt scores", "echo": True, "logprobs": 2, "max_tokens": 4, "n": 2,
            "temperature": 0, "ignore_eos": True}
    full = post(server, "/v1/completions", body)
    status, lines = stream_lines(f"{server.url}/v1/completions", {"model": SERVED_NAME, **body, "stream": True})
    assert status == 200
    got = chunks(lines)
    for index in (0, 1):
        mine = [c["choices"][0] for c in got if c["choices"] and c["choices"][0]["index"] == index]
        assert mine[0]["text"] == "Streaming the prompt scores"  # the echo comes first, with its logprobs
        assert mine[0]["logprobs"]["token_logprobs"][0] is None
        joined = {key: sum((c["logprobs"][key] for c in mine if c["logprobs"]), []) for key in
                  ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
        expected = full["choices"][index]
        assert "".join(c["text"] for c in mine) == expected["text"]
        assert joined["tokens"] == expected["logprobs"]["tokens"]
        assert joined["text_offset"] == expected["logprobs"]["text_offset"]
        assert joined["token_logprobs"][0] is None
        assert joined["token_logprobs"][1:] == pytest.approx(expected["logprobs"]["token_logprobs"][1:], **TOL)


BAD = {
    "prompt_logprobs above 20": ("/v1/completions", {"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
    "prompt_logprobs negative": ("/v1/completions", {"prompt": "x", "prompt_logprobs": -1}, "prompt_logprobs"),
    "prompt_logprobs not an integer": ("/v1/completions", {"prompt": "x", "prompt_logprobs": "2"}, "prompt_logprobs"),
    "prompt_logprobs with stream": ("/v1/completions", {"prompt": "x", "prompt_logprobs": 1, "stream": True},
                                    "prompt_logprobs"),
    "chat prompt_logprobs above 20": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                               "prompt_logprobs": 21}, "prompt_logprobs"),
    "chat max_tokens 0": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
                          "max_tokens"),
    "chat max_completion_tokens 0": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                              "max_completion_tokens": 0}, "max_completion_tokens"),
    "max_tokens negative with echo": ("/v1/completions", {"prompt": "x", "echo": True, "max_tokens": -1},
                                      "max_tokens"),
    "echo logprobs above 20": ("/v1/completions", {"prompt": "x", "echo": True, "logprobs": 21, "max_tokens": 0},
                               "logprobs"),
    "scoring beyond context": ("/v1/completions", {"prompt": [5] * 513, "echo": True, "max_tokens": 0}, "prompt"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_scoring_input(server, case):
    path, body, param = BAD[case]
    r = httpx2.post(server.url + path, json={"model": SERVED_NAME, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    good = post(server, "/v1/completions", {"prompt": "x", "echo": True, "logprobs": 1, "max_tokens": 0})
    assert good["choices"][0]["logprobs"]["token_logprobs"][0] is None

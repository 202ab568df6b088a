"""The OpenAI API of a real server on a tiny random model, through the official SDK and raw SSE."""

from __future__ import annotations

import random

import httpx2
import openai
import pytest
import torch

from tests.helpers.sse import chunks, stream_lines
from tests.integration.conftest import SERVED_NAME

GREEDY = dict(temperature=0.0, extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_health_models_openapi(server):
    health = httpx2.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and health["model"] == SERVED_NAME
    assert health["attention_backend"] in ("mojo", "torch")
    # CUDA: torch.compile's fused layer kernels by default; the CPU: its Mojo layer kernels, or the reference's.
    assert health["layer_ops"] == "compiled" if torch.cuda.is_available() else health["layer_ops"] in ("mojo", "torch")
    # --device auto (the default): the GPU where torch sees one (tests/gpu covers that), else the CPU.
    assert health["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")
    assert health["decode_graphs"].startswith("on (captured") if torch.cuda.is_available() \
        else health["decode_graphs"] == "off (not on a CUDA device)"
    assert health["quantization"] == "none"  # a safetensors checkpoint under --quantization auto
    assert health["activation_quantization"] == "none"  # nothing quantized: the flag changes nothing
    assert health["workers_ready"] == 1
    models = httpx2.get(f"{server.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == [SERVED_NAME]
    spec = httpx2.get(f"{server.url}/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"} <= set(spec["paths"])


def test_completion_stream_equals_non_stream(client):
    kwargs = dict(model=SERVED_NAME, prompt="The quick brown fox", max_tokens=12, **GREEDY)
    full = client.completions.create(**kwargs)
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 12
    assert full.usage.total_tokens == full.usage.prompt_tokens + 12
    pieces = list(client.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in pieces if c.choices) == full.choices[0].text
    assert [c.choices[0].finish_reason for c in pieces if c.choices and c.choices[0].finish_reason] == ["length"]


def test_chat_sse_framing_role_finish_usage(server):
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "n": 2,
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0, "ignore_eos": True}
    status, lines = stream_lines(f"{server.url}/v1/chat/completions", body)
    assert status == 200
    got = chunks(lines)
    assert all(c["object"] == "chat.completion.chunk" for c in got)
    assert len({c["id"] for c in got}) == 1
    for index in (0, 1):
        mine = [c["choices"][0] for c in got if c["choices"] and c["choices"][0]["index"] == index]
        assert mine[0]["delta"]["role"] == "assistant"
        assert all("role" not in c["delta"] for c in mine[1:])
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == ["length"]
    usage_chunks = [c for c in got if c.get("usage")]
    assert len(usage_chunks) == 1 and usage_chunks[0] is got[-1] and got[-1]["choices"] == []
    assert usage_chunks[0]["usage"]["completion_tokens"] == 12
    assert all(c["usage"] is None for c in got[:-1])  # include_usage: null on every other chunk


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
def test_continuous_usage_stats_counts_the_tokens_so_far_on_every_chunk(server, endpoint):
    """vLLM's stream_options.continuous_usage_stats: each chunk's usage is the prompt and the tokens sent so far
    (all choices), never falling, and the last chunk's is the whole request's; without include_usage, none."""
    ask = {"messages": [{"role": "user", "content": "hi"}]} if endpoint.startswith("chat") else {"prompt": "hi"}
    body = {"model": SERVED_NAME, **ask, "max_tokens": 5, "n": 2, "stream": True, "temperature": 0,
            "ignore_eos": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    status, lines = stream_lines(f"{server.url}/v1/{endpoint}", body)
    assert status == 200
    got = chunks(lines)
    assert all(c["usage"] is not None for c in got)
    sent = [c["usage"]["completion_tokens"] for c in got]
    assert sent == sorted(sent) and sent[-1] == 10 and got[-1]["choices"] == []
    assert len({c["usage"]["prompt_tokens"] for c in got}) == 1
    body["stream_options"] = {"continuous_usage_stats": True}
    status, lines = stream_lines(f"{server.url}/v1/{endpoint}", body)
    assert status == 200 and all("usage" not in c for c in chunks(lines))


@pytest.mark.parametrize("stream", [False, True])
def test_skip_special_tokens_false_writes_them_but_not_the_stop_token(server, stream):
    """vLLM's skip_special_tokens: false puts the special tokens the model writes into the text; a special token that
    stops the answer (as an EOS does) is not written, and is still counted."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(server.model / "tokenizer.json"))
    special = min(i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special)
    name = tokenizer.id_to_token(special)

    def complete(**extra) -> tuple[str, str, int]:
        body = {"model": SERVED_NAME, "prompt": "hi", "max_tokens": 3, "logit_bias": {str(special): 100},
                "ignore_eos": True, "stream": stream, **extra}
        if not stream:
            r = httpx2.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
            return r["choices"][0]["text"], r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"]
        status, lines = stream_lines(f"{server.url}/v1/completions",
                                     {**body, "stream_options": {"include_usage": True}})
        got = chunks(lines)
        texts = [c["choices"][0] for c in got if c["choices"]]
        return ("".join(c["text"] for c in texts), next(c["finish_reason"] for c in texts if c["finish_reason"]),
                got[-1]["usage"]["completion_tokens"])

    assert complete() == ("", "length", 3)
    assert complete(skip_special_tokens=False) == (name * 3, "length", 3)
    assert complete(skip_special_tokens=False, stop_token_ids=[special]) == ("", "stop", 1)


def test_chat_non_stream_with_logprobs(client):
    r = client.chat.completions.create(model=SERVED_NAME, messages=[{"role": "system", "content": "be brief"},
                                                                    {"role": "user", "content": "hello"}],
                                       max_completion_tokens=5, logprobs=True, top_logprobs=3, **GREEDY)
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert len(choice.logprobs.content) == 5
    for entry in choice.logprobs.content:
        assert len(entry.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-5)


def test_stop_string_spanning_tokens_never_leaks(client, server, test_seed):
    kwargs = dict(model=SERVED_NAME, prompt="Once upon a time", max_tokens=40, **GREEDY)
    text = client.completions.create(**kwargs).choices[0].text
    rng = random.Random(test_seed)
    start = rng.randrange(len(text) // 3, 2 * len(text) // 3)
    stop = text[start:start + 6]
    expected = text[:text.find(stop)]
    r = client.completions.create(stop=[stop, "\x00never"], **kwargs)
    assert r.choices[0].text == expected and r.choices[0].finish_reason == "stop"
    status, lines = stream_lines(f"{server.url}/v1/completions", {**_raw(kwargs), "stream": True, "stop": stop})
    pieces = [c["choices"][0]["text"] for c in chunks(lines) if c["choices"]]
    assert "".join(pieces) == expected
    assert not any(stop in p for p in pieces)
    # vLLM's include_stop_str_in_output: the same cut, after the stop string instead of before it.
    include = {"extra_body": {"ignore_eos": True, "include_stop_str_in_output": True}}
    kept = client.completions.create(**(kwargs | include), stop=[stop])
    assert kept.choices[0].text == expected + stop and kept.choices[0].finish_reason == "stop"
    chat = dict(model=SERVED_NAME, messages=[{"role": "user", "content": "tell a story"}], max_tokens=40, **GREEDY)
    whole = client.chat.completions.create(**chat).choices[0].message.content
    stop = whole[len(whole) // 2:len(whole) // 2 + 4]
    kept = client.chat.completions.create(**(chat | include), stop=[stop])
    assert kept.choices[0].message.content == whole[:whole.find(stop) + len(stop)]


def _raw(kwargs: dict) -> dict:
    body = {k: v for k, v in kwargs.items() if k != "extra_body"}
    body.update(kwargs.get("extra_body", {}))
    return body


def test_several_prompts_n_echo_and_token_prompts(client):
    r = client.completions.create(model=SERVED_NAME, prompt=["one", "two three"], n=2, max_tokens=3, **GREEDY)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    by_index = {c.index: c.text for c in r.choices}
    assert by_index[0] == by_index[1] and by_index[2] == by_index[3]  # greedy: choices of a prompt agree
    echoed = client.completions.create(model=SERVED_NAME, prompt="echo me", echo=True, max_tokens=2, **GREEDY)
    assert echoed.choices[0].text.startswith("echo me")
    ids = client.completions.create(model=SERVED_NAME, prompt=[[1, 2, 3, 4]], max_tokens=2, **GREEDY)
    assert ids.usage.prompt_tokens == 4


def test_seed_reproduces_sampling(client):
    kwargs = dict(model=SERVED_NAME, prompt="Roll the dice", max_tokens=16, temperature=1.0, seed=1234)
    assert client.completions.create(**kwargs).choices[0].text == client.completions.create(**kwargs).choices[0].text


def test_completion_logprobs(client):
    r = client.completions.create(model=SERVED_NAME, prompt="a b c", max_tokens=4, logprobs=2, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(top) >= 2 for top in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset)


def test_prefix_cache_reported_in_usage_and_metrics(client, server):
    prompt = "shared prefix " * 30
    before = server.metric("mili_prefix_cache_hits_total")
    client.completions.create(model=SERVED_NAME, prompt=prompt + "first", max_tokens=1, **GREEDY)
    second = client.completions.create(model=SERVED_NAME, prompt=prompt + "second", max_tokens=1, **GREEDY)
    assert second.usage.prompt_tokens_details.cached_tokens >= 16
    assert server.metric("mili_prefix_cache_hits_total") - before >= 16


def test_metrics_names(server, client):
    client.completions.create(model=SERVED_NAME, prompt="count me", max_tokens=2, **GREEDY)
    text = httpx2.get(f"{server.url}/metrics").text
    for name in ("mili_requests_running", "mili_requests_waiting", "mili_kv_blocks_total", "mili_kv_blocks_used",
                 "mili_worker_up", "mili_prompt_tokens_total", "mili_generation_tokens_total",
                 "mili_prefix_cache_queries_total", "mili_prefix_cache_hits_total", "mili_preemptions_total",
                 "mili_requests_total", "mili_time_to_first_token_seconds_bucket",
                 "mili_inter_token_latency_seconds_bucket", "mili_e2e_request_latency_seconds_bucket",
                 "mili_request_queue_time_seconds_bucket", "mili_stream_resume_buffered_bytes",
                 "mili_stream_resumes_total", "mili_stream_resume_aborted_total", "mili_stream_resume_evicted_total", "mili_stream_merged_deltas_total",
                 "mili_responses_stored", "mili_responses_stored_bytes"):
        assert f"\n{name}" in text, name
    assert 'mili_requests_total{finish_reason="length",model="tiny-qwen3",task="generate"}' in text
    assert server.metric("mili_worker_up") == 1
    assert server.metric("mili_kv_blocks_total") == 512


def test_sse_keep_alive_comments_while_streaming(server):
    # The shared server pings every 0.2 s; a stream of 400 tokens lasts longer than that.
    body = {"model": SERVED_NAME, "prompt": "long one", "max_tokens": 400, "ignore_eos": True, "stream": True}
    status, lines = stream_lines(f"{server.url}/v1/completions", body)
    assert status == 200
    assert any(line.startswith(":") for line in lines)
    chunks(lines)  # comments do not disturb the framing

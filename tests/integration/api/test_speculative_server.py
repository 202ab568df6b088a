"""A real server with `--speculative-config` (n-gram lookup), through the official SDK: /health and the
start log say what runs; greedy text is the engine's plain output (built in this process without
speculation); stop strings, max_tokens, n > 1, streaming and structured output keep working; the
vLLM-named counters count; a bad config stops the server at startup with the reason."""

from __future__ import annotations

import time

import json
import os
import subprocess
import sys

import httpx2
import openai
import pytest

from shared.config import EngineConfig
from shared.sampling_params import SamplingParams
from tests.helpers.server import ROOT, Server
from worker.engine import LLMEngine

MODEL = "tiny-spec"
SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}'
ENGINE = dict(dtype="float32", quantization="q8_0", num_kv_blocks=256)
PHRASE = [11, 52, 97, 140, 23, 88, 190, 61, 75, 130]
PROMPT = PHRASE * 3 + PHRASE[:3]


@pytest.fixture(scope="module")
def spec_server(tiny_model_dir, tmp_path_factory):
    srv = Server(tiny_model_dir, "--served-model-name", MODEL, "--speculative-config", SPEC, "--quantization", "q8_0", "--num-kv-blocks", "256",
                 log_path=tmp_path_factory.mktemp("spec-logs") / "server.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(spec_server):
    return openai.OpenAI(base_url=f"{spec_server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def plain_ids(tiny_model_dir) -> list[int]:
    """The greedy continuation of PROMPT without speculation."""
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), **ENGINE))
    [done] = engine.generate([PROMPT], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    return list(done.token_ids[0])


@pytest.fixture(scope="module")
def plain_text(tiny_model_dir, plain_ids) -> str:
    """Its text as the server writes it: a random model may emit special tokens, which are left out."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir)).decode(plain_ids, skip_special_tokens=True)


def _lookup_finds_a_draft(output: list[int]) -> bool:
    """Whether prompt lookup (1-gram and up) has something to propose at some decode step that may draft: a
    generated token that already occurs earlier in the prompt or the output (a random model may never repeat
    one), early enough that a draft fits before max_tokens (verifying d drafts emits up to d + 1 tokens, so the
    engine drafts after output token i only while i + 3 <= len(output): worker/spec/speculator.py)."""
    return any(t in PROMPT + output[:i] for i, t in enumerate(output[:len(output) - 2]))


def test_health_and_log_say_what_runs(spec_server):
    health = httpx2.get(f"{spec_server.url}/health").json()
    assert health["speculative_decoding"].startswith("ngram (prompt lookup 1..3 tokens, 4 speculative tokens)")
    assert "speculative decoding ngram" in spec_server.log_path.read_text(errors="replace")


def test_greedy_text_is_the_plain_engines_and_counters_count(spec_server, client, plain_text, plain_ids):
    drafts_before = spec_server.metric("vllm:spec_decode_num_drafts_total")
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0.0,
                                      extra_body={"ignore_eos": True})
    assert reply.choices[0].text == plain_text
    assert reply.usage.completion_tokens == 40
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0.0, stream=True, extra_body={"ignore_eos": True}))
    assert streamed == plain_text
    # Workers report their counts with their step stats; wait for a report after the requests.
    if _lookup_finds_a_draft(plain_ids):
        deadline = time.monotonic() + 10
        while spec_server.metric("vllm:spec_decode_num_drafts_total") <= drafts_before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert spec_server.metric("vllm:spec_decode_num_drafts_total") > drafts_before
    assert spec_server.metric("vllm:spec_decode_num_draft_tokens_total") >= \
        spec_server.metric("vllm:spec_decode_num_accepted_tokens_total")


def test_stop_strings_max_tokens_and_n(client, plain_text):
    stop = plain_text[len(plain_text) // 2:len(plain_text) // 2 + 3]
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0.0, stop=[stop],
                                      extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].text == plain_text[:plain_text.index(stop)]  # never past the stop, never leaked
    for k in (1, 3, 7):
        short = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=k, temperature=0.0,
                                          extra_body={"ignore_eos": True})
        assert short.usage.completion_tokens == k and short.choices[0].finish_reason == "length"
    many = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0.8, n=3, seed=5,
                                     extra_body={"ignore_eos": True})
    assert len(many.choices) == 3 and many.usage.completion_tokens == 36
    with_logprobs = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0.0,
                                              logprobs=2, extra_body={"ignore_eos": True})
    assert len(with_logprobs.choices[0].logprobs.token_logprobs) == 10


def test_structured_output_speculates_within_its_grammar(client):
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a JSON object"}],
                                           response_format={"type": "json_object"}, max_tokens=30, temperature=0.0)
    text = reply.choices[0].message.content
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # cut by max_tokens: a prefix of a JSON object
        assert text.lstrip().startswith("{")


@pytest.mark.parametrize(("config", "says"), [
    ("{not json", "not valid JSON"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_mx": 3}', "prompt_lookup_mx"),
])
def test_bad_config_stops_the_server_at_startup(tiny_model_dir, config, says):
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--model", str(tiny_model_dir),
                           "--speculative-config", config], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ))
    assert done.returncode == 2
    assert "--speculative-config" in done.stderr and says in done.stderr

"""n > 1: a choice that ends on a stop string is aborted alone in the worker, and the other choices run on
unchanged.

The server's KV cache holds two full-length choices but not three (20 blocks of 8 tokens; a choice of 63
tokens needs 8). Running all three to the end forces a preemption; when one stops early and its blocks are
freed at once, the other two fit and nothing is preempted.
"""

from __future__ import annotations

import httpx2
import pytest

from tests.helpers.server import Server, build_served_tiny_model

NAME = "tiny"
PROMPT = "Once upon a"  # shorter than a block: the choices share no blocks
MAX_TOKENS = 60


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = build_served_tiny_model("qwen3", 11, tmp_path_factory.mktemp("abort") / "tiny")
    # Quantized: the integer kernels give a row the same bits whatever else is in the batch, so a choice
    # run alone is the exact reference for the same choice run beside others. In float32, torch's matmuls
    # round differently with the batch's shape, and a sampled draw landing within that rounding of a CDF
    # step flips (seed 905501110: token 55 of choice 0, logprobs 1e-6 apart).
    srv = Server(model, "--served-model-name", NAME, "--num-kv-blocks", "20", "--block-size", "8",
                 "--quantization", "q8_0", log_path=tmp_path_factory.mktemp("abort-logs") / "server.log").start()
    yield srv
    srv.stop()


def complete(server, **body) -> dict:
    # top_k 20: few CDF steps for a draw to land near, a margin beside the quantized kernels' exact bits.
    r = httpx2.post(server.url + "/v1/completions", json={"model": NAME, "prompt": PROMPT, "max_tokens": MAX_TOKENS,
                                                          "temperature": 1.0, "top_k": 20, "ignore_eos": True,
                                                          **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def texts(body: dict) -> list[str]:
    return [c["text"] for c in sorted(body["choices"], key=lambda c: c["index"])]


def test_stopped_choice_frees_its_blocks_and_the_others_run_on(server, test_seed):
    # Choice i of a seeded request samples with seed + i: each choice alone, as a reference.
    alone = [texts(complete(server, seed=test_seed + i))[0] for i in range(3)]
    assert server.metric("mili_preemptions_total") == 0  # one choice at a time fits

    # A stop string that choice 1 hits early and the others never contain.
    victim = alone[1]
    start = next(a for a in range(5, len(victim) - 8)
                 if victim.find(victim[a:a + 8]) == a and victim[a:a + 8].strip()
                 and all(victim[a:a + 8] not in other for other in (alone[0], alone[2])))
    assert start < 40  # early: a few tokens in
    body = complete(server, seed=test_seed, n=3, stop=[victim[start:start + 8]])
    assert texts(body) == [alone[0], victim[:start], alone[2]]
    assert [c["finish_reason"] for c in sorted(body["choices"], key=lambda c: c["index"])] == ["length", "stop",
                                                                                              "length"]
    # Choice 1's blocks came back within a step of its stop, so the other two never ran out.
    assert server.metric("mili_preemptions_total") == 0
    assert body["usage"]["completion_tokens"] < 3 * MAX_TOKENS

    # The control: the same three choices, none stopping early, do not fit.
    complete(server, seed=test_seed, n=3)
    assert server.metric("mili_preemptions_total") > 0
    assert server.metric("mili_kv_blocks_used") == 0

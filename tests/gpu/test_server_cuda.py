"""`mili serve --device cuda` end to end: real gateway and worker processes, the official openai SDK.

The greedy continuation equals transformers' greedy decoding on the same GPU (float32), a seeded sampled
request streams the same text it returns whole and does not change when other requests share its batches,
and /health names the device. The rest of the API runs against a CUDA server through the integration suite
itself: `pytest --server-device cuda tests/integration/api/test_api.py ...` (what `make gpu-check` runs).
"""

from __future__ import annotations

import concurrent.futures

import openai
import pytest
import torch

from tests.gpu import DEVICE
from tests.helpers.server import Server, build_served_tiny_model

NAME = "tiny-qwen3"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_served_tiny_model("qwen3", 1234, tmp_path_factory.mktemp("served") / NAME)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    srv = Server(model_dir, "--device", DEVICE, "--served-model-name", NAME, "--max-num-seqs", "8",
                 "--num-kv-blocks", "256", log_path=tmp_path_factory.mktemp("logs") / "server.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_health_names_the_device(server):
    health = server.wait_healthy()
    if DEVICE == "cpu":  # a rehearsal: the CPU serves with its own kernels
        assert health["device"] == "cpu"
        return
    # float32: the GPU attention module serves bfloat16 only, so the torch reference serves, labelled so.
    assert (health["device"], health["attention_backend"], health["dtype"]) == ("cuda:0", "torch", "float32")
    assert health["layer_ops"] == "compiled"  # CUDA's default (no --enforce-eager)
    assert health["decode_graphs"].startswith("on (captured, rows 1,2,4,8;"), health["decode_graphs"]


def test_greedy_equals_transformers(client, model_dir):
    """The served text is the decode of transformers' greedy tokens (special tokens skipped, as served)."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    prompt = [5, 300, 42, 9000, 17, 250, 3, 77]
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=24, temperature=0,
                                  extra_body={"ignore_eos": True})
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(DEVICE).eval()
    ids = torch.tensor([prompt], device=DEVICE)
    with torch.no_grad():  # greedy, the end token an ordinary one (ignore_eos), as the request asks
        for _ in range(24):
            ids = torch.cat([ids, hf(ids).logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    expected = ids[0, len(prompt):].tolist()
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert r.usage.completion_tokens == 24
    assert r.choices[0].text == tok.decode(expected, skip_special_tokens=True)


def test_seeded_sampling_is_independent_of_the_batch(client):
    kwargs = dict(model=NAME, prompt="Roll the dice", max_tokens=24, temperature=1.0, top_p=0.9, seed=77,
                  extra_body={"ignore_eos": True})
    alone = client.completions.create(**kwargs).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True) if c.choices)
    assert streamed == alone
    others = [dict(model=NAME, prompt=f"Other prompt {i}", max_tokens=16 + 4 * i, temperature=0.7,
                   extra_body={"ignore_eos": True, "top_k": 5}) for i in range(5)]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(client.completions.create, **o) for o in others]
        crowded = pool.submit(client.completions.create, **kwargs)
        assert crowded.result().choices[0].text == alone
        assert all(len(f.result().choices[0].text) > 0 for f in futures)
    assert client.completions.create(**dict(kwargs, seed=78)).choices[0].text != alone

"""A Mistral checkpoint with a sliding window through the real server: served as MistralForCausalLM with its context
capped at the window (/health and GET /v1/models say so), transformers' greedy tokens within the window (which
transformers masks with the window), and a prompt past it a 400 naming the length."""

from __future__ import annotations

import json
import random

import httpx2
import pytest
import torch

from tests.helpers.server import Server, build_served_tiny_model

WINDOW = 96


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    seed = random.randrange(2**31)
    print(f"\n[windowed mistral] seed={seed}")
    model_dir = tmp_path_factory.mktemp("windowed") / "tiny-mistral"
    model_dir.mkdir()
    build_served_tiny_model("mistral", seed, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps(config | {"sliding_window": WINDOW}))
    srv = Server(model_dir, log_path=tmp_path_factory.mktemp("logs") / "server.log").start()
    yield srv, model_dir
    srv.stop()


def _transformers_greedy(model_dir, prompt: list[int], max_tokens: int) -> list[int]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert model.config.sliding_window == WINDOW
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             do_sample=False)
    return out[0, len(prompt):].tolist()


def test_the_window_caps_the_served_context(windowed):
    srv, model_dir = windowed
    health = httpx2.get(f"{srv.url}/health").json()
    assert "MistralForCausalLM" in json.dumps(health)
    model = httpx2.get(f"{srv.url}/v1/models").json()["data"][0]
    assert model["max_model_len"] == WINDOW
    prompt = random.Random(0).choices(range(3, 1000), k=WINDOW - 12)
    body = {"model": model["id"], "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    r = httpx2.post(f"{srv.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["token_ids"] == _transformers_greedy(model_dir, prompt, 12)
    too_long = httpx2.post(f"{srv.url}/v1/completions", json=body | {"prompt": prompt + prompt[:20]}, timeout=60)
    assert too_long.status_code == 400 and str(WINDOW) in too_long.json()["error"]["message"], too_long.text

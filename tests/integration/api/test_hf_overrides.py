"""`--hf-overrides`: config.json keys replaced at load, as vLLM's flag. The use it exists for: YaRN on a
Qwen checkpoint (its model card's recipe for contexts past the trained length), which stretches the served
context and changes every rotation; the served tokens are transformers' with the same config."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.server import Server

ORIGINAL, FACTOR = 256, 4.0  # the tiny model says max_position_embeddings 512
YARN = {"rope_type": "yarn", "factor": FACTOR, "original_max_position_embeddings": ORIGINAL}


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    srv = Server(tiny_model_dir, "--hf-overrides", json.dumps({"rope_scaling": YARN}), "--num-kv-blocks", "128",
                 log_path=tmp_path_factory.mktemp("overrides") / "server.log").start()
    yield srv
    srv.stop()


def _transformers_greedy(model_dir, prompt: list[int], max_tokens: int) -> list[int]:
    import transformers

    config = transformers.AutoConfig.from_pretrained(model_dir)
    config.rope_parameters = config.rope_parameters | YARN  # keeps rope_theta, as the server's merge does
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             do_sample=False)
    return out[0, len(prompt):].tolist()


def test_yarn_stretches_the_context_and_serves_the_references_tokens(server, tiny_model_dir, test_seed):
    import httpx2

    models = httpx2.get(f"{server.url}/v1/models").json()["data"]
    assert models[0]["max_model_len"] == int(ORIGINAL * FACTOR)
    # Past both the trained and the original length, where YaRN's interpolated frequencies matter most.
    prompt = torch.randint(3, 1000, (600,), generator=torch.Generator().manual_seed(test_seed)).tolist()
    body = {"model": models[0]["id"], "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    r = httpx2.post(f"{server.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    from transformers import AutoTokenizer

    # A random model may emit special tokens, which the server leaves out of the text (as vLLM does).
    expected = AutoTokenizer.from_pretrained(str(tiny_model_dir)).decode(
        _transformers_greedy(tiny_model_dir, prompt, 8), skip_special_tokens=True)
    assert r.json()["choices"][0]["text"] == expected, f"seed={test_seed}"
    too_long = httpx2.post(f"{server.url}/v1/completions", json=body | {"prompt": prompt * 2}, timeout=60)
    assert too_long.status_code == 400 and "1024" in too_long.json()["error"]["message"]


def test_an_override_the_engine_cannot_run_stops_the_start_by_name(tiny_model_dir, tmp_path):
    overrides = json.dumps({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    srv = Server(tiny_model_dir, "--hf-overrides", overrides, log_path=tmp_path / "server.log")
    with pytest.raises(RuntimeError, match="unsupported rope_scaling type 'dynamic'"):
        srv.start()


@pytest.mark.parametrize("value", ["[1]", "{not json"])
def test_an_override_that_is_not_a_json_object_is_a_usage_error(tiny_model_dir, tmp_path, value):
    srv = Server(tiny_model_dir, "--hf-overrides", value, log_path=tmp_path / "server.log")
    with pytest.raises(RuntimeError, match="--hf-overrides"):
        srv.start()

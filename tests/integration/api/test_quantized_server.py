"""A real server quantizing its checkpoint at load (`--quantization q4_0`): /health and the startup log
say what runs, and it serves through the official SDK with the same greedy tokens as the engine
built in this process with the same settings."""

from __future__ import annotations

import httpx2
import openai

from shared.config import EngineConfig
from shared.sampling_params import SamplingParams
from tests.helpers.server import Server
from worker.engine import LLMEngine


def test_quantized_server_reports_and_serves(tiny_model_dir, tmp_path):
    srv = Server(tiny_model_dir, "--served-model-name", "tiny-q", "--quantization", "q4_0", "--num-kv-blocks", "128",
                 log_path=tmp_path / "server.log").start()
    try:
        health = httpx2.get(f"{srv.url}/health").json()
        assert health["quantization"] == "q4_0"
        assert health["activation_quantization"] == "int8x2"  # auto on a generating server: decode's accuracy
        assert "quantization q4_0 (activations int8x2)" in srv.log_path.read_text(errors="replace")
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=60)
        reply = client.completions.create(model="tiny-q", prompt=[5, 17, 42, 99], max_tokens=10, temperature=0.0,
                                          extra_body={"ignore_eos": True})
    finally:
        srv.stop()
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), dtype="float32", quantization="q4_0",
                                    num_kv_blocks=128))
    engine.add_request("r", [5, 17, 42, 99], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    local: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            local.extend(out.new_token_ids)
    assert reply.usage.completion_tokens == 10 and len(local) == 10
    from transformers import AutoTokenizer

    # A random model may emit special tokens, which the server leaves out of the text (as vLLM does).
    expected = AutoTokenizer.from_pretrained(str(tiny_model_dir)).decode(local, skip_special_tokens=True)
    assert reply.choices[0].text == expected

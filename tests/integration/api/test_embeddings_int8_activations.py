"""An embedding server on quantized weights (`--quantization q8_0`) runs the kernels' one-part int8 activations
(what `--activation-quantization auto` picks for `--task embed`): /health and the start log say so, its vectors stay
within a stated cosine of sentence-transformers' float ones (the oracle runs in a process of its own), and a text's
vector does not move when it is batched with others."""

from __future__ import annotations

import asyncio

import httpx2
import pytest
import torch

from tests.helpers.pooling_models import module_embedding_model
from tests.helpers.sentence_transformers_oracle import SentenceTransformerOracle
from tests.helpers.server import Server

NAME = "tiny-embed-q8"
TEXTS = ["Quantized weights keep a model small.", "Instruct: Given a question, retrieve passages that answer it\n"
         "Query: why quantize activations?", "one", "A pooled vector per text, compared by cosine with the float "
         "model's, the same text batched or alone.", "x " * 40]
# Q8_0 weights and int8 activations (each about 8 bits per 32-element block) against the float model, per vector's
# cosine with the float one. Measured on these random tiny models over seeds 1-16: every text 0.9988-0.9999, the
# five texts' mean at least 0.9993; one CI run's seed gave a text 0.9966 (the mean 0.9991). A kernel that got a
# block's arithmetic wrong lands far below both bounds.
MIN_COSINE = 0.99
MIN_MEAN_COSINE = 0.998


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return module_embedding_model(tmp_path_factory, NAME)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    srv = Server(model_dir, "--served-model-name", NAME, "--quantization", "q8_0", "--num-kv-blocks", "128",
                 "--max-num-batched-tokens", "64", "--max-model-len", "128",
                 log_path=tmp_path_factory.mktemp("logs") / "embed-q8.log").start()
    yield srv
    srv.stop()


def _embed(server: Server, texts: list[str]) -> torch.Tensor:
    r = httpx2.post(f"{server.url}/v1/embeddings", json={"model": NAME, "input": texts}, timeout=60)
    assert r.status_code == 200, r.text
    return torch.tensor([d["embedding"] for d in r.json()["data"]])


def test_health_and_log_name_the_activation_mode(server):
    health = httpx2.get(f"{server.url}/health").json()
    assert health["task"] == "embed" and health["quantization"] == "q8_0"
    assert health["activation_quantization"] == "int8"
    log = server.log_path.read_text(errors="replace")
    assert "quantization q8_0 (activations int8)" in log


def test_vectors_stay_near_the_float_model(server, model_dir):
    got = _embed(server, TEXTS)
    with SentenceTransformerOracle(model_dir) as st:
        want = st.encode(TEXTS, batch_size=1)
    cosine = torch.nn.functional.cosine_similarity(got, want, dim=-1)
    print(f"cosine to the float model per text: {[round(c, 5) for c in cosine.tolist()]}")
    assert (cosine >= MIN_COSINE).all() and cosine.mean() >= MIN_MEAN_COSINE, cosine
    # Quantized, not the float path by accident: the vectors differ from the float ones.
    assert not torch.allclose(got, want, atol=1e-5, rtol=0)


def test_a_text_keeps_its_vector_among_concurrent_requests(server):
    """Batched with others, a text gets exactly the vector it gets alone: the kernels give a row the same bits in any
    batch in this mode too (tests/unit/kernels/test_quant_kernel.py), and a prompt's attention the same bits however
    the token budget and prefix-cache hits chunk it (tests/unit/kernels/test_reference_attention.py)."""
    texts = [f"{TEXTS[i % len(TEXTS)]} #{i}" for i in range(3 * len(TEXTS))]
    alone = [_embed(server, [text])[0] for text in texts]

    async def together() -> list[torch.Tensor]:
        async with httpx2.AsyncClient(timeout=60) as client:
            async def one(text: str) -> torch.Tensor:
                r = await client.post(f"{server.url}/v1/embeddings", json={"input": text})
                assert r.status_code == 200, r.text
                return torch.tensor(r.json()["data"][0]["embedding"])
            return await asyncio.gather(*(one(text) for text in texts))

    batched = asyncio.run(together())
    print(f"largest difference alone / batched: {max((a - b).abs().max().item() for a, b in zip(alone, batched))}")
    for i, vector in enumerate(batched):
        assert torch.equal(vector, alone[i]), (i, (vector - alone[i]).abs().max().item())


def test_the_flag_overrides_auto(model_dir, tmp_path):
    """`--activation-quantization int8x2` reaches the worker of an embedding server (auto would run int8)."""
    srv = Server(model_dir, "--served-model-name", NAME, "--quantization", "q8_0", "--activation-quantization",
                 "int8x2", "--num-kv-blocks", "64", "--max-model-len", "128", log_path=tmp_path / "x2.log").start()
    try:
        assert httpx2.get(f"{srv.url}/health").json()["activation_quantization"] == "int8x2"
        assert "quantization q8_0 (activations int8x2)" in srv.log_path.read_text(errors="replace")
        assert _embed(srv, TEXTS[:2]).shape[0] == 2
    finally:
        srv.stop()

"""`mili serve --task auto` on a tiny Qwen3-Reranker-style causal model, on its Q8_0 GGUF as llama.cpp's converter
writes one, and on a tiny Qwen3ForSequenceClassification: /v1/rerank, /rerank (Jina's shape and TEI's) and /score
against the computation done with transformers, and bad inputs."""

from __future__ import annotations

import os
import random

import httpx2
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from loadtest.fixtures.reranker_gguf import write_reranker_gguf
from tests.helpers.pooling_models import build_classifier_model, build_reranker_model
from tests.helpers.server import Server

QUERY = "what does a reranker do?"
DOCS = ["A reranker scores how well a document answers a query.", "Bananas are yellow.",
        "Cross-encoders read the query and the document together.", "The weather is fine today, thanks."]
# Qwen3-Reranker's model card, byte for byte (the oracle's own copy of the prompt).
PREFIX = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct '
          'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
# A Q8_0 GGUF served from its blocks against the same weights in float32: the kernels' two-part int8 activations
# (about 15 bits) move a tiny random reranker's P(yes) by 1e-4 at most (measured over 5 seeds: 2e-5 to 9e-5).
# How far the kernels' activation rounding moves a score from the float computation over the same weights: the
# two-part (~15-bit) activations, and the one-part int8 ones a scoring server uses by default (llama.cpp's own
# rounding: llama-server differs from the F32 computation by up to 0.017 on these tiny models). Measured on the
# Q8_0 reranker of seeds 0-63: two-part at most 1e-4; one-part at most 0.029 (typically about 0.01), and a CI run's seed
# reached 0.041, so its bound is twice that.
ACTIVATION_ROUNDING = {"int8x2": 1e-3, "int8": 8e-2}
# ... and against the safetensors weights it was quantized from: Q8_0's weight rounding, which on a random tiny
# model (not trained, its logits steep) moved P(yes) by up to 0.044 over 8 seeds.
Q8_0_WEIGHT_ROUNDING = 0.1


# Two requests for the same pairs, scored by the float32 model: within the bound the scores keep against transformers
# (1e-5 above), not bit for bit. Batches and prefix-cache hits change the matmuls' row counts, and torch's float32
# matmul takes another kernel for a few rows than for many, so identical requests differ by rounding: up to 6e-7 over
# six seeds here, and a CI run saw 1.3e-6 (P(yes) near 0.25).
SAME_PAIRS = 1e-5


def _seed() -> int:
    seed = int(os.environ.get("MILI_TEST_SEED", random.randrange(2**31)))
    print(f"\n[tiny reranker] MILI_TEST_SEED={seed}")  # in the captured output of a failure: replay with it
    return seed


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory):
    return build_reranker_model(tmp_path_factory.mktemp("rerank") / "tiny-Qwen3-Reranker", _seed())


@pytest.fixture(scope="module")
def reranker(reranker_dir, tmp_path_factory):
    srv = Server(reranker_dir, "--num-kv-blocks", "128", "--max-model-len", "256",
                 log_path=tmp_path_factory.mktemp("logs") / "rerank.log").start()
    yield srv
    srv.stop()


def _same(results: list[dict], expected: list[dict]) -> bool:
    """The same documents in the same order, with scores equal to float32 rounding."""
    return len(results) == len(expected) and all(
        r.keys() == e.keys() and r["index"] == e["index"] and abs(r["relevance_score"] - e["relevance_score"]) < 1e-6
        and r.get("document") == e.get("document") for r, e in zip(results, expected))


def _pair_prompts(tok, query: str, docs: list[str], instruction: str) -> list[list[int]]:
    """The model card's prompts: prefix + body + suffix, each tokenized on its own."""
    prefix, suffix = tok.encode(PREFIX, add_special_tokens=False), tok.encode(SUFFIX, add_special_tokens=False)
    return [prefix + tok.encode(f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}",
                                add_special_tokens=False) + suffix for doc in docs]


def _yes_probabilities(model_dir, query: str, docs: list[str], instruction: str = DEFAULT_INSTRUCTION) -> list[float]:
    """The model card's computation: log_softmax over [no, yes] at the last position of each prompt."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    scores = []
    for prompt in _pair_prompts(tok, query, docs, instruction):
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0, -1]
        scores.append(torch.log_softmax(logits[[no, yes]], dim=0).exp()[1].item())
    return scores


def _yes_label_probabilities(model_dir, query: str, docs: list[str]) -> list[float]:
    """llama.cpp's computation on a reranker GGUF: the softmax of its two-row head at the last position, the "yes"
    row's probability; here transformers' sequence classifier over the GGUF's weights (dequantized)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    yes = model.config.label2id["yes"]
    scores = []
    for prompt in _pair_prompts(tok, query, docs, DEFAULT_INSTRUCTION):
        with torch.no_grad():
            scores.append(torch.softmax(model(torch.tensor([prompt])).logits[0], dim=0)[yes].item())
    return scores


def test_rerank_matches_the_yes_no_computation(reranker, reranker_dir):
    assert httpx2.get(f"{reranker.url}/health").json()["task"] == "score"
    expected = _yes_probabilities(reranker_dir, QUERY, DOCS)
    r = httpx2.post(f"{reranker.url}/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=60)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["relevance_score"] for x in results] == sorted((x["relevance_score"] for x in results), reverse=True)
    for x in results:
        assert abs(x["relevance_score"] - expected[x["index"]]) < 1e-5
        assert x["document"] == {"text": DOCS[x["index"]]}
    assert r.json()["usage"]["prompt_tokens"] == r.json()["usage"]["total_tokens"] > 0
    # The second request reads the first's prompt blocks from the prefix cache: the same scores, to float rounding.
    again = httpx2.post(f"{reranker.url}/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=60)
    assert _same(again.json()["results"], results)
    top = httpx2.post(f"{reranker.url}/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 2,
                                                      "return_documents": False}, timeout=60).json()["results"]
    assert _same(top, [{"index": x["index"], "relevance_score": x["relevance_score"]} for x in results[:2]])
    for alias in ("/reranking", "/v1/reranking"):  # llama-server's spellings of the route
        spelled = httpx2.post(f"{reranker.url}{alias}", json={"query": QUERY, "documents": DOCS}, timeout=60)
        assert spelled.status_code == 200 and _same(spelled.json()["results"], results), spelled.text


def test_instruction_and_score_route(reranker, reranker_dir):
    instruction = "Judge whether the passage is about fruit"
    expected = _yes_probabilities(reranker_dir, QUERY, DOCS, instruction)
    r = httpx2.post(f"{reranker.url}/score", json={"text_1": QUERY, "text_2": DOCS, "instruction": instruction},
                    timeout=60)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [d["index"] for d in data] == list(range(len(DOCS))) and all(d["object"] == "score" for d in data)
    for d, want in zip(data, expected):
        assert abs(d["score"] - want) < 1e-5
    pairwise = httpx2.post(f"{reranker.url}/v1/score", json={"text_1": [QUERY, QUERY], "text_2": DOCS[:2],
                                                             "instruction": instruction}, timeout=60).json()
    for d, want in zip(pairwise["data"], data[:2]):
        assert abs(d["score"] - want["score"]) < SAME_PAIRS
    # vLLM's later names for the two sides score the same.
    for first, second in (("queries", "documents"), ("queries", "items"), ("data_1", "data_2")):
        named = httpx2.post(f"{reranker.url}/score", json={first: QUERY, second: DOCS, "instruction": instruction},
                            timeout=60)
        assert named.status_code == 200, named.text
        for d, want in zip(named.json()["data"], data):
            assert abs(d["score"] - want["score"]) < SAME_PAIRS


@pytest.mark.parametrize("path,body,param", [
    ("/v1/rerank", {"query": QUERY, "documents": []}, "documents"),
    ("/v1/rerank", {"query": "", "documents": ["d"]}, "query"),
    ("/v1/rerank", {"query": QUERY, "documents": ["d", ""]}, "documents"),
    ("/v1/rerank", {"query": QUERY, "documents": ["d"], "top_n": -1}, "top_n"),
    ("/v1/rerank", {"query": QUERY * 40, "documents": ["d"]}, "documents"),
    ("/score", {"text_1": [QUERY, QUERY], "text_2": DOCS}, "text_2"),
    ("/score", {"queries": [QUERY, QUERY], "documents": DOCS}, "documents"),
    ("/score", {"text_1": QUERY, "documents": DOCS}, "text_1"),  # two pairs' halves
    ("/score", {"queries": QUERY, "documents": DOCS, "items": DOCS}, "text_1"),
    ("/score", {"text_1": QUERY}, "text_1"),
    ("/score", {"data_1": QUERY, "data_2": [""]}, "data_2"),
    ("/v1/embeddings", {"input": "x"}, None),
])
def test_bad_inputs(reranker, path, body, param):
    r = httpx2.post(f"{reranker.url}{path}", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    if param is None:
        assert "--task score" in r.json()["error"]["message"]


def test_a_json_null_body_is_a_400_on_the_routes_that_read_it_first(reranker):
    """/rerank and POST / read the body to pick a dialect, then hand it on: JSON null is the picked route's 400."""
    for path in ("/rerank", "/v1/rerank", "/"):
        r = httpx2.post(f"{reranker.url}{path}", content=b"null", headers={"content-type": "application/json"},
                        timeout=30)
        assert r.status_code in (400, 422) and "must be a JSON object" in r.text, (path, r.text)


def test_tei_rerank_dialect(reranker, reranker_dir):
    """TEI's /rerank (`texts`, a bare array of {index, score}, highest first) on the same routes as Jina's, and TEI's
    POST / on a scoring server: the scores the yes/no computation gives."""
    expected = _yes_probabilities(reranker_dir, QUERY, DOCS)
    for path in ("/rerank", "/v1/rerank", "/"):
        r = httpx2.post(f"{reranker.url}{path}", json={"query": QUERY, "texts": DOCS}, timeout=60)
        assert r.status_code == 200, r.text
        results = r.json()
        assert sorted(x["index"] for x in results) == list(range(len(DOCS)))
        assert [x["score"] for x in results] == sorted((x["score"] for x in results), reverse=True)
        assert all(x.keys() == {"index", "score"} and abs(x["score"] - expected[x["index"]]) < 1e-5 for x in results)
    with_text = httpx2.post(f"{reranker.url}/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True},
                            timeout=60).json()
    assert all(x["text"] == DOCS[x["index"]] for x in with_text)
    info = httpx2.get(f"{reranker.url}/info", timeout=30).json()
    assert "reranker" in info["model_type"] and info["max_input_length"] == 256


@pytest.mark.parametrize("body,status,kind", [
    ({"query": QUERY, "texts": []}, 400, "Empty"),
    ({"query": QUERY, "texts": ["fine", ""]}, 400, "Empty"),
    ({"query": QUERY, "texts": ["d"], "raw_scores": True}, 422, "Validation"),
    ({"query": QUERY, "texts": ["d"], "raw_scores": 0}, 422, "Validation"),  # strict: 0 is not false
    ({"query": "", "texts": ["d"]}, 422, "Validation"),
    ({"query": QUERY, "texts": ["d"], "truncation_direction": "Left"}, 422, "Validation"),
    ({"query": QUERY, "texts": ["d" * 5000], "truncate": False}, 422, "Validation"),
])
def test_tei_rerank_bad_inputs(reranker, body, status, kind):
    r = httpx2.post(f"{reranker.url}/rerank", json=body, timeout=60)
    assert r.status_code == status and r.json()["error_type"] == kind, r.text
    assert httpx2.get(f"{reranker.url}/health").status_code == 200


def test_truncated_pair_keeps_the_prompt_frame(reranker):
    r = httpx2.post(f"{reranker.url}/v1/rerank", json={"query": QUERY * 40, "documents": ["d"],
                                                       "truncate_prompt_tokens": 200}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 200


@pytest.mark.parametrize("activations", ["int8x2", "auto"])
def test_reranker_gguf_serves_its_quantized_weights(reranker, reranker_dir, tmp_path_factory, activations):
    """The reranker's Q8_0 GGUF (a two-row yes/no head, pooling RANK) served from its own blocks: llama.cpp's score
    over the GGUF's weights, to the rounding of the kernels' activations, in both rerank shapes; and near the
    safetensors checkpoint's scores, the Q8_0 rounding of its weights apart."""
    from shared.default_model import converted_gguf

    gguf_path = write_reranker_gguf(reranker_dir, tmp_path_factory.mktemp("gguf") / "tiny-reranker-q8_0.gguf", QT.Q8_0)
    expected = _yes_label_probabilities(converted_gguf(gguf_path, gguf_path.stem), QUERY, DOCS)
    srv = Server(gguf_path, "--num-kv-blocks", "64", "--max-model-len", "256", "--activation-quantization",
                 activations, log_path=tmp_path_factory.mktemp("logs") / "rerank-gguf.log").start()
    try:
        health = httpx2.get(f"{srv.url}/health").json()
        jina = httpx2.post(f"{srv.url}/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=60)
        cohere = httpx2.post(f"{srv.url}/v2/rerank", json={"query": QUERY, "documents": DOCS}, timeout=60)
    finally:
        srv.stop()
    mode = "int8" if activations == "auto" else activations  # auto: one-part int8 on a scoring server
    assert (health["task"], health["quantization"], health["activation_quantization"]) == ("score", "q8_0", mode)
    assert jina.status_code == cohere.status_code == 200, (jina.text, cohere.text)
    for x in jina.json()["results"]:
        assert abs(x["relevance_score"] - expected[x["index"]]) < ACTIVATION_ROUNDING[mode]
    assert [x["relevance_score"] for x in cohere.json()["results"]] == [x["relevance_score"]
                                                                        for x in jina.json()["results"]]
    original = {x["index"]: x["relevance_score"] for x in httpx2.post(
        f"{reranker.url}/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=60).json()["results"]}
    for x in jina.json()["results"]:
        assert abs(x["relevance_score"] - original[x["index"]]) < Q8_0_WEIGHT_ROUNDING


def test_sequence_classifier_head(tmp_path_factory):
    import transformers
    from tokenizers import Tokenizer

    model_dir = build_classifier_model(tmp_path_factory.mktemp("cls") / "tiny-cls", _seed())
    srv = Server(model_dir, "--num-kv-blocks", "64", log_path=tmp_path_factory.mktemp("logs") / "cls.log").start()
    try:
        r = httpx2.post(f"{srv.url}/v1/rerank", json={"query": QUERY, "documents": DOCS}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        srv.stop()
    hf = transformers.Qwen3ForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for x in r.json()["results"]:
        with torch.no_grad():
            logit = hf(torch.tensor([tok.encode(QUERY, DOCS[x["index"]]).ids])).logits[0, 0]
        assert abs(x["relevance_score"] - torch.sigmoid(logit).item()) < 1e-5

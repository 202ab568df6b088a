"""Cohere's rerank API (POST /v2/rerank) end to end with Cohere's official Python SDK (`cohere.ClientV2`), against
`mili serve` on a random tiny Qwen3-Reranker-style model: the scores /v1/rerank gives, in Cohere's shape, and bad
inputs as the SDK's BadRequestError naming the field."""

from __future__ import annotations

import random

import cohere
import httpx2
import jsonschema
import pytest

from tests.helpers.pooling_models import build_reranker_model
from tests.helpers.server import Server

QUERY = "what does a reranker do?"
DOCS = ["A reranker scores how well a document answers a query.", "Bananas are yellow.",
        "Cross-encoders read the query and the document together.", "The weather is fine today, thanks."]
CONTEXT = 256
# SmolLM2's tokenizer reads "word word word ..." as "word" then one " word" per repeat: N words are N tokens.
LONG_DOC = "word " * 400


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    seed = random.randrange(2**31)
    print(f"\n[cohere reranker] seed={seed}")
    model_dir = build_reranker_model(tmp_path_factory.mktemp("cohere") / "tiny-Qwen3-Reranker", seed)
    srv = Server(model_dir, "--num-kv-blocks", "128", "--max-model-len", str(CONTEXT),
                 log_path=tmp_path_factory.mktemp("logs") / "cohere.log").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def co(server):
    return cohere.ClientV2(api_key="none", base_url=server.url, timeout=120)


@pytest.fixture(scope="module")
def model(server):
    return httpx2.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]["id"]


def _v1(server, documents: list[str]) -> dict[int, float]:
    r = httpx2.post(f"{server.url}/v1/rerank", json={"query": QUERY, "documents": documents}, timeout=60)
    assert r.status_code == 200, r.text
    return {x["index"]: x["relevance_score"] for x in r.json()["results"]}


def test_rerank_in_cohere_shape_with_v1_scores(server, co, model):
    expected = _v1(server, DOCS)
    response = co.rerank(model=model, query=QUERY, documents=DOCS)
    order = sorted(expected, key=lambda i: -expected[i])
    assert [r.index for r in response.results] == order
    for r in response.results:
        assert abs(r.relevance_score - expected[r.index]) < 1e-6
    assert response.id and response.meta.api_version.version == "2"
    assert response.meta.billed_units.search_units == 1
    assert response.meta.tokens.input_tokens > 0

    same = co.rerank(model=model, query=QUERY, documents=DOCS, priority=0)  # Cohere's default, served
    assert [r.index for r in same.results] == order
    for r in same.results:
        assert abs(r.relevance_score - expected[r.index]) < 1e-6

    top = co.rerank(model=model, query=QUERY, documents=DOCS, top_n=2)
    assert [r.index for r in top.results] == order[:2]
    assert [r.index for r in co.rerank(model=model, query=QUERY, documents=DOCS, top_n=10).results] == order


def test_document_objects_and_return_documents(server, model):
    """Cohere's v1 fields: documents as {text} objects, and each result's document when asked."""
    expected = _v1(server, DOCS[:2])
    r = httpx2.post(f"{server.url}/v2/rerank", json={"model": model, "query": QUERY, "return_documents": True,
                                                     "documents": [DOCS[0], {"text": DOCS[1]}]}, timeout=60)
    assert r.status_code == 200, r.text
    route = httpx2.get(f"{server.url}/openapi.json", timeout=10).json()["paths"]["/v2/rerank"]["post"]
    jsonschema.validate(r.json(), route["responses"]["200"]["content"]["application/json"]["schema"])
    for x in r.json()["results"]:
        assert x["document"] == {"text": DOCS[x["index"]]}
        assert abs(x["relevance_score"] - expected[x["index"]]) < 1e-6


def test_max_tokens_per_doc_cuts_each_document(server, co, model):
    cut = co.rerank(model=model, query=QUERY, documents=[LONG_DOC, DOCS[0]], max_tokens_per_doc=50)
    expected = _v1(server, [("word " * 50).strip(), DOCS[0]])
    assert sorted(r.index for r in cut.results) == [0, 1]
    for r in cut.results:
        assert abs(r.relevance_score - expected[r.index]) < 1e-6


@pytest.mark.parametrize("kwargs,param", [
    ({"documents": []}, "documents"),
    ({"query": ""}, "query"),
    ({"documents": ["d", ""]}, "documents"),
    ({"documents": [{"text": "d", "title": "t"}]}, "documents[0]"),  # Cohere v1's rank_fields are not served
    ({"top_n": 0}, "top_n"),
    ({"max_tokens_per_doc": 0}, "max_tokens_per_doc"),
    ({"documents": [LONG_DOC]}, "documents"),  # cut to the default 4096 tokens: still over the context
    ({"documents": [LONG_DOC], "max_tokens_per_doc": 300}, "documents"),
    ({"query": QUERY * 40, "max_tokens_per_doc": 10}, "documents"),  # the query alone fills the context
    ({"priority": 3}, "priority"),  # this server schedules first come, first served: only 0
    ({"relevant_spans": cohere.RerankRelevantSpans(mode="enabled")}, "relevant_spans"),
])
def test_bad_inputs_are_a_bad_request_naming_the_field(co, model, kwargs, param):
    request = {"model": model, "query": QUERY, "documents": DOCS} | kwargs
    with pytest.raises(cohere.errors.BadRequestError) as e:
        co.rerank(**request)
    assert e.value.body["error"]["param"] == param, e.value.body
    assert e.value.body["error"]["message"]


def test_another_model_is_not_found(co):
    with pytest.raises(cohere.errors.NotFoundError) as e:
        co.rerank(model="another-model", query=QUERY, documents=DOCS)
    assert e.value.body["error"]["param"] == "model"

"""`mili serve` on a tiny sentence-transformers checkpoint laid out as Qwen3-Embedding's is (last-token pooling,
Normalize, the tokenizer appending <|endoftext|>), found by `--task auto`: /v1/embeddings against
sentence-transformers, through raw HTTP and the openai SDK, and every bad input; TEI's /embed and /similarity and
huggingface_hub's feature_extraction and sentence_similarity on the same vectors."""

from __future__ import annotations

import asyncio
import base64
import os
import random
import struct

import httpx2
import pytest
import torch

from tests.helpers.pooling_models import build_embedding_model
from tests.helpers.sentence_transformers_oracle import SentenceTransformerOracle
from tests.helpers.server import Server

NAME = "tiny-embed"
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Instruct: Given a web search query, retrieve relevant "
         "passages that answer the query\nQuery: what is an embedding?", "short", "Embeddings turn text into "
         "vectors, one vector per text, whose cosine says how alike two texts are."]
CONTEXT = 128


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    seed = int(os.environ.get("MILI_TEST_SEED", random.randrange(2**31)))
    print(f"\n[tiny embedding model] MILI_TEST_SEED={seed}")
    return build_embedding_model(tmp_path_factory.mktemp("embed") / NAME, seed, "last", normalize=True)


@pytest.fixture(scope="module")
def st(model_dir):
    with SentenceTransformerOracle(model_dir) as oracle:
        yield oracle


@pytest.fixture(scope="module")
def embed_server(model_dir, tmp_path_factory):
    srv = Server(model_dir, "--served-model-name", NAME, "--num-kv-blocks", "128", "--max-num-batched-tokens", "64",
                 "--max-model-len", str(CONTEXT), log_path=tmp_path_factory.mktemp("logs") / "embed.log").start()
    yield srv
    srv.stop()


def _post(server: Server, path: str, body: dict) -> httpx2.Response:
    return httpx2.post(f"{server.url}{path}", json=body, timeout=60)


def _vectors(response: httpx2.Response) -> list[torch.Tensor]:
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [d["index"] for d in data] == list(range(len(data))) and all(d["object"] == "embedding" for d in data)
    return [torch.tensor(d["embedding"]) for d in data]


def test_task_is_read_from_the_checkpoint(embed_server):
    assert httpx2.get(f"{embed_server.url}/health").json()["task"] == "embed"
    assert httpx2.get(f"{embed_server.url}/v1/models").json()["data"][0]["task"] == "embed"
    assert "task embed, from the checkpoint" in embed_server.log_path.read_text()
    document = httpx2.get(f"{embed_server.url}/openapi.json").json()
    paths = document["paths"]
    assert "/v1/embeddings" in paths and "/embedding" in paths and "/v1/chat/completions" not in paths
    schemas = document["components"]["schemas"]  # `dimensions` at most the model's embedding size
    for body in ("EmbeddingRequest", "OllamaEmbedRequest", "TeiEmbedBody"):
        assert schemas[body]["properties"]["dimensions"]["anyOf"][0]["maximum"] == 64, body
    # The chat page talks to /v1/chat/completions, which an embedding server does not answer: no page either (/
    # takes TEI's POST there).
    assert httpx2.get(f"{embed_server.url}/").status_code == 405


def test_embeddings_match_sentence_transformers(embed_server, st):
    r = _post(embed_server, "/v1/embeddings", {"model": NAME, "input": TEXTS})
    expected = st.encode(TEXTS, batch_size=1)
    for got, want in zip(_vectors(r), expected):
        torch.testing.assert_close(got, want.float(), atol=1e-4, rtol=1e-4)
    tokens = sum(map(len, st.input_ids(TEXTS)))  # the appended EOS counts
    assert r.json()["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert r.json()["model"] == NAME and r.json()["object"] == "list"
    one = _vectors(_post(embed_server, "/v1/embeddings", {"input": TEXTS[1]}))  # a string; model may be left out
    torch.testing.assert_close(one[0], expected[1].float(), atol=1e-4, rtol=1e-4)


def test_token_ids_base64_and_dimensions(embed_server, st):
    ids = st.input_ids(TEXTS[:2])
    as_text = _vectors(_post(embed_server, "/v1/embeddings", {"input": TEXTS[:2]}))
    as_ids = _vectors(_post(embed_server, "/v1/embeddings", {"input": ids}))
    single = _vectors(_post(embed_server, "/v1/embeddings", {"input": ids[0]}))
    torch.testing.assert_close(as_ids[0], as_text[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(as_ids[1], as_text[1], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(single[0], as_text[0], atol=1e-6, rtol=1e-6)
    r = _post(embed_server, "/v1/embeddings", {"input": TEXTS[:2], "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    for item, want in zip(r.json()["data"], as_text):
        raw = base64.b64decode(item["embedding"])
        torch.testing.assert_close(torch.tensor(struct.unpack(f"<{len(raw) // 4}f", raw)), want)
    # Matryoshka: the first d values, re-normalized (sentence-transformers' truncate_dim with normalization).
    r = _post(embed_server, "/v1/embeddings", {"input": TEXTS, "dimensions": 16})
    want = st.encode(TEXTS, batch_size=1, truncate_dim=16, normalize_embeddings=True)
    for got, w in zip(_vectors(r), want):
        assert got.shape == (16,)
        torch.testing.assert_close(got, w.float(), atol=1e-4, rtol=1e-4)


def test_openai_sdk_end_to_end(embed_server, st):
    import openai

    client = openai.OpenAI(base_url=f"{embed_server.url}/v1", api_key="unused")
    result = client.embeddings.create(model=NAME, input=TEXTS)  # the SDK asks for base64 and decodes it
    expected = st.encode(TEXTS, batch_size=1)
    for item, want in zip(result.data, expected):
        torch.testing.assert_close(torch.tensor(item.embedding), want.float(), atol=1e-4, rtol=1e-4)
    assert result.usage.prompt_tokens == result.usage.total_tokens > len(TEXTS)
    floats = client.embeddings.create(model=NAME, input="short", encoding_format="float", dimensions=8, user="me")
    assert len(floats.data[0].embedding) == 8


def test_ollama_client_embeds_as_sentence_transformers(embed_server, st):
    """Ollama's official client: /api/embed (one text, several, `dimensions`, `truncate`) and the older
    /api/embeddings give sentence-transformers' vectors, under the served name or its `:latest` spelling."""
    import ollama

    client = ollama.Client(host=embed_server.url, timeout=60)
    expected = st.encode(TEXTS, batch_size=1)
    result = client.embed(model=f"{NAME}:latest", input=TEXTS)
    for got, want in zip(result.embeddings, expected, strict=True):
        torch.testing.assert_close(torch.tensor(got), want.float(), atol=1e-4, rtol=1e-4)
    assert result.prompt_eval_count == sum(map(len, st.input_ids(TEXTS)))
    [one] = client.embed(model=NAME, input=TEXTS[1]).embeddings
    torch.testing.assert_close(torch.tensor(one), expected[1].float(), atol=1e-4, rtol=1e-4)
    [short] = client.embed(model=NAME, input=TEXTS[0], dimensions=16).embeddings
    want = st.encode(TEXTS[:1], batch_size=1, truncate_dim=16, normalize_embeddings=True)[0]
    torch.testing.assert_close(torch.tensor(short), want.float(), atol=1e-4, rtol=1e-4)
    legacy = client.embeddings(model=NAME, prompt=TEXTS[2]).embedding
    torch.testing.assert_close(torch.tensor(legacy), expected[2].float(), atol=1e-4, rtol=1e-4)
    long_text = "word " * (2 * CONTEXT)
    assert len(client.embed(model=NAME, input=long_text).embeddings) == 1  # cut at the context by default
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model=NAME, input=long_text, truncate=False)
    assert e.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="nope", input="x")
    assert e.value.status_code == 404


@pytest.mark.parametrize("path,body,valid", [
    ("/api/embed", {"model": f"{NAME}:latest", "input": ["x", "y"], "truncate": True, "dimensions": 8.0,
                    "keep_alive": 0, "options": {"num_ctx": 64}, "unknown": 1}, True),
    ("/api/embed", {"model": NAME, "input": []}, True),
    ("/api/embed", {"model": NAME, "input": "x", "dimensions": "8"}, False),
    ("/api/embed", {"model": NAME, "input": "x", "truncate": "false"}, False),
    ("/api/embed", {"model": NAME, "input": 5}, False),
    ("/api/embed", {"model": NAME, "input": [""]}, False),
    ("/api/embed", {"model": NAME, "input": "x", "dimensions": 0}, False),
    ("/api/embed", {"input": "x"}, False),
    ("/api/embed", {"model": "other", "input": "x"}, False),
    ("/api/embeddings", {"model": NAME, "prompt": "x", "keep_alive": "5m"}, True),
    ("/api/embeddings", {"model": NAME, "prompt": 5}, False),
    ("/api/embeddings", {"model": NAME, "prompt": "x", "options": []}, False),
    ("/api/embeddings", {"model": f"{NAME}:7b", "prompt": "x"}, False),
])
def test_ollama_embed_bodies_are_answered_as_the_schema_says(embed_server, path, body, valid):
    """/openapi.json's Ollama embed bodies state what the routes accept: each body here is valid against the
    document exactly when the route answers 200, and a refused one gets Ollama's {"error": message}."""
    import jsonschema

    doc = httpx2.get(f"{embed_server.url}/openapi.json").json()
    schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert jsonschema.Draft202012Validator({**schema, "components": doc["components"]}).is_valid(body) == valid
    r = _post(embed_server, path, body)
    assert (r.status_code == 200) == valid, r.text
    if not valid:
        assert r.status_code in (400, 404) and set(r.json()) == {"error"}, r.text


def test_concurrent_requests_get_their_own_vectors(embed_server):
    """Under load the engine batches requests together; each vector is still the one it gets alone."""
    texts = [f"{TEXTS[i % len(TEXTS)]} #{i}" for i in range(24)]
    alone = [_vectors(_post(embed_server, "/v1/embeddings", {"input": t}))[0] for t in texts[:4]]

    async def run() -> list[httpx2.Response]:
        async with httpx2.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(client.post(f"{embed_server.url}/v1/embeddings", json={"input": t})
                                          for t in texts))

    together = [_vectors(r)[0] for r in asyncio.run(run())]
    for i in range(4):
        torch.testing.assert_close(together[i], alone[i], atol=1e-6, rtol=1e-5)
    assert embed_server.metric("mili_requests_total", task="embed", finish_reason="stop") >= 24
    assert embed_server.metric("mili_prompt_tokens_total", task="embed") > 0


def test_truncate_prompt_tokens_keeps_the_first_tokens_and_the_eos(embed_server, st):
    long_text = " ".join(TEXTS * 6)
    (ids,) = st.input_ids([long_text])
    assert len(ids) > CONTEXT
    r = _post(embed_server, "/v1/embeddings", {"input": long_text})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text
    # OpenAI's code and words for an overflow, which LiteLLM's embedding() maps to its ContextWindowExceededError
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["message"].startswith(f"This model's maximum context length is {CONTEXT} tokens.")
    cut = _vectors(_post(embed_server, "/v1/embeddings", {"input": long_text, "truncate_prompt_tokens": 20}))[0]
    by_ids = _vectors(_post(embed_server, "/v1/embeddings", {"input": ids[:19] + ids[-1:]}))[0]
    torch.testing.assert_close(cut, by_ids, atol=1e-6, rtol=1e-6)
    whole = _post(embed_server, "/v1/embeddings", {"input": long_text, "truncate_prompt_tokens": -1})
    assert whole.status_code == 200 and whole.json()["usage"]["prompt_tokens"] == CONTEXT


@pytest.mark.parametrize("body,param", [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": ["fine", ""]}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [5, 10**9]}, "input"),
    ({"input": [[1, 2], [3, 49152 * 4]]}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x", "dimensions": 65}, "dimensions"),
    ({"input": "x", "truncate_prompt_tokens": CONTEXT + 1}, "truncate_prompt_tokens"),
    ({"input": "x", "model": "other"}, "model"),
    ({"input": "x", "temperature": 1}, "temperature"),
    ({"input": ["x"] * 2049}, "input"),
])
def test_bad_inputs_are_400s_naming_the_field(embed_server, body, param):
    r = _post(embed_server, "/v1/embeddings", body)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param, r.text
    assert httpx2.get(f"{embed_server.url}/health").status_code == 200


def test_other_tasks_routes_name_the_task(embed_server):
    for path, body in (("/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"model": NAME, "prompt": "hi"}),
                       ("/v1/rerank", {"query": "q", "documents": ["d"]}),
                       ("/score", {"text_1": "q", "text_2": "d"})):
        r = _post(embed_server, path, body)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"]["code"] == "wrong_task" and "--task embed" in r.json()["error"]["message"]


def test_llama_cpp_embedding_is_the_same_vectors_normalized_as_asked(embed_server, st):
    """llama.cpp server's /embedding (and /embeddings): `content` or `input`, one prompt or several, answered as
    [{index, embedding: [vector]}], the vector the model's pooling gives, then embd_normalize (default unit length:
    this model's vectors are unit length already)."""
    want = _vectors(_post(embed_server, "/v1/embeddings", {"input": TEXTS}))
    for path, body in (("/embedding", {"content": TEXTS}), ("/embeddings", {"input": TEXTS}),
                       ("/embedding", {"content": st.input_ids(TEXTS), "embd_normalize": -1})):
        r = _post(embed_server, path, body)
        assert r.status_code == 200, r.text
        assert [item["index"] for item in r.json()] == list(range(len(TEXTS)))
        for item, w in zip(r.json(), want):
            assert len(item["embedding"]) == 1
            torch.testing.assert_close(torch.tensor(item["embedding"][0]), w, atol=1e-5, rtol=1e-5)
    # Scaled so the largest magnitude is 32760: compared at the scale of the others (the two requests' vectors
    # differ by float rounding, which the scale multiplies).
    scaled = torch.tensor(_post(embed_server, "/embedding", {"content": TEXTS[0], "embd_normalize": 0}).json()[0][
        "embedding"][0], dtype=torch.float64)
    assert scaled.abs().max().item() == pytest.approx(32760, rel=1e-12)
    torch.testing.assert_close(scaled / 32760, (want[0] / want[0].abs().max()).double(), atol=1e-5, rtol=1e-5)
    taxicab = torch.tensor(_post(embed_server, "/embedding", {"content": TEXTS[0], "embd_normalize": 1}).json()[0][
        "embedding"][0], dtype=torch.float64)
    assert taxicab.abs().sum().item() == pytest.approx(1, rel=1e-12)
    torch.testing.assert_close(taxicab * want[0].abs().sum().double(), want[0].double(), atol=1e-5, rtol=1e-5)
    # A text and token ids mixed: one prompt, the text tokenized with the tokenizer's special tokens, the ids after.
    ids = st.input_ids(TEXTS[:1])[0] + [5, 6]
    by_ids = _vectors(_post(embed_server, "/v1/embeddings", {"input": ids}))[0]
    mixed = _post(embed_server, "/embedding", {"content": [TEXTS[0], 5, 6]}).json()
    torch.testing.assert_close(torch.tensor(mixed[0]["embedding"][0]), by_ids, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("body,param", [
    ({}, "content"), ({"content": ""}, "content"), ({"content": [["a", "b"]]}, "content"),
    ({"content": "a", "input": "b"}, "content"),
    ({"content": "x", "embd_normalize": -2}, "embd_normalize"), ({"content": [10**9]}, "input"),
    ({"content": "x " * CONTEXT}, "input"),
])
def test_llama_cpp_embedding_bad_inputs(embed_server, body, param):
    r = _post(embed_server, "/embedding", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_generation_server_refuses_embeddings(server):
    r = httpx2.post(f"{server.url}/v1/embeddings", json={"input": "hi"}, headers=server.auth_headers(), timeout=30)
    assert r.status_code == 400 and "--task generate" in r.json()["error"]["message"], r.text
    assert httpx2.get(f"{server.url}/health").json()["task"] == "generate"


def test_a_client_that_leaves_aborts_its_inputs_and_frees_their_blocks(embed_server):
    """2048 long inputs take a while: the client gives up once they run, and every one of them is dropped."""
    from tests.integration.streams.test_disconnect import wait_idle

    body = {"input": [f"{i} {TEXTS[3]} {TEXTS[1]}" for i in range(2048)]}
    aborted = embed_server.metric("mili_requests_total", task="embed", finish_reason="abort")

    async def run() -> None:
        async with httpx2.AsyncClient(base_url=embed_server.url, timeout=120) as client:
            request = asyncio.create_task(client.post("/v1/embeddings", json=body))
            deadline = asyncio.get_running_loop().time() + 30
            while await asyncio.to_thread(embed_server.metric, "mili_requests_running") == 0:
                assert asyncio.get_running_loop().time() < deadline, "the inputs never ran"
                await asyncio.sleep(0.02)
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)

    asyncio.run(run())
    wait_idle(embed_server, timeout=30)
    assert embed_server.metric("mili_requests_total", task="embed", finish_reason="abort") == aborted + 1


def test_deadline_passed_is_a_504(embed_server):
    r = httpx2.post(f"{embed_server.url}/v1/embeddings", json={"input": TEXTS}, timeout=30,
                    headers={"X-Request-Timeout": "0.000001"})
    assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded", r.text
    assert embed_server.metric("mili_requests_total", task="embed", finish_reason="deadline") >= 1


# ----- text-embeddings-inference's API: POST /embed, POST /, GET /info -----
def _tei(server: Server, path: str, body: dict, status: int = 200):
    r = _post(server, path, body)
    assert r.status_code == status, r.text
    return r.json()


def test_tei_embed_is_the_same_vectors(embed_server, st):
    expected = [v.float() for v in st.encode(TEXTS, batch_size=1)]
    for path in ("/embed", "/"):  # TEI's POST / runs its model's route: /embed on an embedding model
        batch = _tei(embed_server, path, {"inputs": TEXTS})
        assert len(batch) == len(TEXTS)
        for got, want in zip(batch, expected):
            torch.testing.assert_close(torch.tensor(got), want, atol=1e-4, rtol=1e-4)
    single = _tei(embed_server, "/embed", {"inputs": TEXTS[0]})  # one text: still a list of one vector
    assert len(single) == 1
    torch.testing.assert_close(torch.tensor(single[0]), expected[0], atol=1e-4, rtol=1e-4)
    (ids,) = st.input_ids([TEXTS[2]])
    by_ids = _tei(embed_server, "/embed", {"inputs": ids})  # a list of ints is one input's token ids
    torch.testing.assert_close(torch.tensor(by_ids[0]), expected[2], atol=1e-4, rtol=1e-4)
    # This checkpoint normalizes (its Normalize module): normalize false gives that same vector.
    raw = _tei(embed_server, "/embed", {"inputs": TEXTS[1], "normalize": False})
    torch.testing.assert_close(torch.tensor(raw[0]), expected[1], atol=1e-4, rtol=1e-4)


def test_tei_dimensions_cut_before_normalizing(embed_server, st):
    whole = st.encode([TEXTS[0]])[0].float()
    unit = _tei(embed_server, "/embed", {"inputs": TEXTS[0], "dimensions": 16})[0]
    torch.testing.assert_close(torch.tensor(unit), whole[:16] / whole[:16].norm(), atol=1e-4, rtol=1e-4)
    cut = _tei(embed_server, "/embed", {"inputs": TEXTS[0], "dimensions": 16, "normalize": False})[0]
    torch.testing.assert_close(torch.tensor(cut), whole[:16], atol=1e-4, rtol=1e-4)


def test_tei_truncates_by_default_from_either_end(embed_server, st):
    long_text = " ".join(TEXTS * 6)
    (ids,) = st.input_ids([long_text])
    assert len(ids) > CONTEXT
    first = _tei(embed_server, "/embed", {"inputs": long_text})[0]  # TEI's default: truncate (--auto-truncate)
    assert first == _tei(embed_server, "/embed", {"inputs": long_text, "truncation_direction": "Right"})[0]
    def by_ids(kept: list[int]) -> torch.Tensor:
        return torch.tensor(_tei(embed_server, "/embed", {"inputs": kept})[0])

    # The tokenizer's appended EOS is added again after the cut, from either end.
    torch.testing.assert_close(torch.tensor(first), by_ids(ids[:CONTEXT - 1] + ids[-1:]), atol=1e-6, rtol=1e-6)
    last = _tei(embed_server, "/embed", {"inputs": long_text, "truncation_direction": "Left"})[0]
    torch.testing.assert_close(torch.tensor(last), by_ids(ids[-CONTEXT:-1] + ids[-1:]), atol=1e-6, rtol=1e-6)
    refused = _tei(embed_server, "/embed", {"inputs": long_text, "truncate": False}, status=422)
    assert refused["error_type"] == "Validation" and "context length" in refused["error"]


@pytest.mark.parametrize("body,status,kind", [
    ({"inputs": ""}, 400, "Empty"),
    ({"inputs": []}, 400, "Empty"),
    ({"inputs": ["fine", ""]}, 400, "Empty"),
    ({"inputs": "x", "dimensions": 0}, 422, "Validation"),
    ({"inputs": "x", "dimensions": 65}, 422, "Validation"),
    ({"inputs": "x", "prompt_name": "query"}, 422, "Validation"),
    ({"inputs": "x", "normalize": "yes"}, 422, "Validation"),
    ({"inputs": "x", "truncation_direction": "Up"}, 422, "Validation"),
    ({"inputs": [5, 10**9]}, 422, "Validation"),
    ({"inputs": ["x"] * 2049}, 422, "Validation"),
    ({"text": "x"}, 422, "Validation"),
])
def test_tei_bad_inputs_are_its_errors(embed_server, body, status, kind):
    assert _tei(embed_server, "/embed", body, status=status)["error_type"] == kind
    assert httpx2.get(f"{embed_server.url}/health").status_code == 200


@pytest.mark.parametrize("path, status", [("/", 422), ("/embed", 422), ("/similarity", 422), ("/v1/embeddings", 400),
                                          ("/embedding", 400), ("/api/embed", 400)])
def test_a_json_null_body_is_refused_by_every_route(embed_server, path, status):
    """POST / reads the body to pick TEI's route, then hands it on: a body of JSON null is that route's error too,
    not a second read of a spent stream."""
    r = httpx2.post(f"{embed_server.url}{path}", content=b"null", headers={"content-type": "application/json"},
                    timeout=30)
    assert r.status_code == status and "must be a JSON object" in r.text, r.text


def test_tei_info_describes_the_embedder(embed_server):
    info = httpx2.get(f"{embed_server.url}/info", timeout=30).json()
    assert info["model_id"] == info["served_model_name"] == NAME
    assert info["model_type"] == {"embedding": {"pooling": "last_token"}}
    assert info["max_input_length"] == CONTEXT and info["auto_truncate"] is True


def test_huggingface_hub_feature_extraction(embed_server, st, monkeypatch):
    """huggingface_hub's InferenceClient pointed at the server's URL, as its docs point it at a TEI endpoint: it
    POSTs the text to / and reads an array of vectors."""
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the tests run offline; the client calls only this URL
    got = InferenceClient(model=embed_server.url, timeout=60).feature_extraction(TEXTS[3])
    assert got.shape == (1, st.encode([TEXTS[3]]).shape[1])
    torch.testing.assert_close(torch.from_numpy(got[0]), st.encode([TEXTS[3]])[0].float(), atol=1e-4, rtol=1e-4)


def test_tei_similarity_is_the_cosine_of_the_vectors(embed_server, st, monkeypatch):
    vectors = st.encode(TEXTS).float()
    want = [torch.nn.functional.cosine_similarity(vectors[0], v, dim=0).item() for v in vectors[1:]]
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
    for path in ("/similarity", "/"):  # POST / takes it too, as huggingface_hub's sentence_similarity sends it
        assert _tei(embed_server, path, body) == pytest.approx(want, abs=1e-4)
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    got = InferenceClient(model=embed_server.url, timeout=60).sentence_similarity(TEXTS[0], TEXTS[1:])
    assert got == pytest.approx(want, abs=1e-4)
    empty = _tei(embed_server, "/similarity", {"inputs": {"source_sentence": TEXTS[0], "sentences": []}}, 400)
    assert empty["error_type"] == "Empty"
    assert _tei(embed_server, "/similarity", {"inputs": "x"}, 422)["error_type"] == "Validation"

"""Response bodies of the pooling routes (gateway/pooling/output.py): Matryoshka truncation, base64 as the openai SDK
decodes it, llama.cpp's embd_normalize, rerank ordering, and Cohere's v2 shape."""

from __future__ import annotations

import base64
import math

import numpy as np

from gateway.pooling.output import cohere_rerank_body, encode_embedding, llama_normalized, matryoshka, rerank_body


def test_matryoshka_keeps_the_first_values_at_unit_length():
    vector = [0.6, 0.8, 3.0, -4.0]
    assert matryoshka(vector, None) == vector and matryoshka(vector, 4) == vector
    head = matryoshka(vector, 2)
    assert head == [0.6 / 1.0, 0.8 / 1.0]
    assert math.isclose(math.hypot(*matryoshka([3.0, 4.0, 1.0], 2)), 1.0)


def test_base64_is_little_endian_float32_as_the_sdk_reads_it():
    vector = [0.1, -2.5, 3.25e-8]
    decoded = np.frombuffer(base64.b64decode(encode_embedding(vector, "base64")), dtype="<f4")  # the SDK's own decode
    assert decoded.tolist() == np.array(vector, dtype=np.float32).tolist()
    assert encode_embedding(vector, "float") is vector


def test_llama_cpp_normalizations_are_its_common_embd_normalize():
    vector = [3.0, -4.0, 0.0, 1.0]
    assert llama_normalized(vector, -1) is vector
    assert llama_normalized(vector, 0) == [v * 32760.0 / 4.0 for v in vector]  # the largest magnitude at 32760
    assert llama_normalized(vector, 1) == [v / 8.0 for v in vector]
    assert np.allclose(llama_normalized(vector, 2), np.array(vector) / math.sqrt(26.0), rtol=1e-15)
    assert np.allclose(llama_normalized(vector, 3), np.array(vector) / (27 + 64 + 1) ** (1 / 3), rtol=1e-15)
    assert llama_normalized([0.0, 0.0], 2) == [0.0, 0.0]  # no norm: zeros, as llama.cpp's
    assert llama_normalized([2.0, 1.0], 10**6) == [0.0, 0.0]  # the p-norm's sum past the doubles: zeros too


def test_rerank_sorts_cuts_and_drops_documents_when_asked():
    body = rerank_body("m", ["a", "b", "c"], [0.2, 0.9, 0.2], top_n=2, return_documents=True, num_tokens=9)
    assert [(r["index"], r["document"]["text"]) for r in body["results"]] == [(1, "b"), (0, "a")]
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    every = rerank_body("m", ["a", "b", "c"], [0.2, 0.9, 0.3], top_n=0, return_documents=False, num_tokens=9)
    assert every["results"] == [{"index": 1, "relevance_score": 0.9}, {"index": 2, "relevance_score": 0.3},
                                {"index": 0, "relevance_score": 0.2}]


def test_cohere_shape_bills_a_search_unit_per_hundred_documents():
    body = cohere_rerank_body(["d"] * 250, [i / 250 for i in range(250)], top_n=3, return_documents=False,
                              num_tokens=1000)
    assert [r["index"] for r in body["results"]] == [249, 248, 247] and "document" not in body["results"][0]
    assert body["meta"] == {"api_version": {"version": "2", "is_experimental": False},
                            "billed_units": {"search_units": 3}, "tokens": {"input_tokens": 1000, "output_tokens": 0}}
    assert "model" not in body and "usage" not in body

"""llama.cpp's /completion and /embedding bodies in the OpenAPI document: what the document calls valid is what the
server accepts (the body validated, then what the route checks: a completion's translated into it and its checks
run), with the served vocabulary and context filled in."""

from __future__ import annotations

import jsonschema
import pytest

from gateway.llamacpp.completion_schema import LlamaCompletionBody
from gateway.llamacpp.to_completion import completion_body, llama_names
from gateway.openai.parse import Limits, parse_completion
from gateway.openai.validation import validate
from gateway.openapi import ServedBounds, document
from gateway.pooling.prompts import llama_inputs
from gateway.pooling.schema import LlamaEmbeddingBody
from gateway.server.errors import ApiError
from shared.request_limits import OutOfBounds, check_prompt_fits
from shared.sampling_params import SamplingParamsError

VOCAB, CONTEXT = 1000, 64
LIMITS = Limits(max_n=4, max_stop=4, max_stop_length=32)


def _tokenize(text: str, add_special: bool) -> list[int]:
    return [ord(c) % VOCAB for c in text]  # a token per character, all within the vocabulary


def _run(body: dict) -> None:
    """The route's checks of `body`, as far as a body alone decides; raises what refuses it."""
    with llama_names():
        request = parse_completion(completion_body(validate(LlamaCompletionBody, body, ()), "m", _tokenize),
                                   LIMITS, default_max_tokens=None)
        prompt = request.prompts[0]
        ids = _tokenize(prompt, True) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise OutOfBounds("the prompt is empty after tokenization", "prompt")
        request.params.check_token_ids(VOCAB)  # the route's checks once the worker's bounds are known
        try:
            check_prompt_fits(ids, request.params.max_tokens, VOCAB, CONTEXT)
        except OutOfBounds as e:
            raise OutOfBounds(str(e), "n_predict" if e.param == "max_tokens" else e.param) from None


def _accepted(body: dict) -> bool:
    try:
        _run(body)
        return True
    except (ApiError, OutOfBounds, SamplingParamsError):
        return False


def _validator(component: str = "LlamaCompletionBody", **bounds) -> jsonschema.Draft202012Validator:
    doc = document(ServedBounds(("m",), LIMITS, **bounds))
    return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{component}",
                                            "components": doc["components"]})


def body(**fields) -> dict:
    return {"prompt": "hi", **fields}


BODIES = [
    body(), {}, body(prompt=[5, 6]), body(prompt=[5.0, "a"]), body(prompt=["a", "b"]),
    body(prompt=[]), body(prompt=[999]), body(prompt=[1000]), body(prompt=[-1]), body(prompt=[1.5]),
    body(prompt=[5] * 63, n_predict=1),
    body(n_predict=-1), body(n_predict=0), body(n_predict=-2), body(n_predict=1), body(n_predict=4.0),
    body(n_predict=62), body(n_predict=64), body(n_predict=2.5),
    body(temperature=-3), body(temperature=2), body(temperature=2.5), body(temperature=0, top_k=-1),
    body(top_k=-2), body(top_p=0), body(top_p=1), body(min_p=1.5), body(seed=-1), body(seed=2**63),
    body(stop=[]), body(stop=[""]), body(stop=["a"] * 5), body(stop=["x" * 33]), body(stop="a"),
    body(n_probs=20), body(n_probs=21), body(repeat_penalty=0), body(repeat_penalty=1.5),
    body(presence_penalty=3), body(frequency_penalty=-2),
    body(typical_p=1), body(typical_p=0.9), body(mirostat=0.0), body(mirostat=2), body(top_n_sigma=-1),
    body(dynatemp_range=0.5), body(grammar=""), body(grammar="root ::= \"a\""),
    body(json_schema={"type": "object"}), body(n_indent=-4), body(t_max_predict_ms=9.0),
    body(logit_bias=[[5, 1.5]]), body(logit_bias=[[5.0, -100]]), body(logit_bias=[[5, 101]]),
    body(logit_bias=[[5, True]]), body(logit_bias=[[5, False]]), body(logit_bias=[[1000, 1]]),
    body(logit_bias=[["hello", 2]]), body(logit_bias=[["999", 2]]), body(logit_bias=[["1000", 2]]),
    body(logit_bias=[["01", 2]]), body(logit_bias=[[5, 1, 2]]), body(logit_bias=[[1.5, 1]]),
    body(logit_bias=[[2, "x"]]), body(logit_bias=[[True, 1]]), body(logit_bias={"5": 1}),
    body(logit_bias={"hello": False}), body(logit_bias={"5": True}), body(logit_bias={"1000": 1}),
    body(logit_bias={"007": 1}), body(logit_bias={"5": -101}), body(logit_bias={}),
    body(unknown_field=1, cache_prompt=True),
]


@pytest.mark.parametrize("given", BODIES, ids=[str(i) for i in range(len(BODIES))])
def test_document_and_server_agree(given):
    assert _validator(vocab_size=VOCAB, max_model_len=CONTEXT).is_valid(given) == _accepted(given), given


# Valid by the document, refused by a rule between fields that JSON Schema cannot state (each in its field's
# description), with a 400 naming the field: (body, the field).
BEYOND_THE_SCHEMA = [
    (body(prompt=""), "prompt"),  # no tokens to continue
    (body(prompt=[5] * 64), "prompt"),  # the whole context, no room for a token
    (body(n_predict=63), "n_predict"),  # the prompt's 2 tokens and 63 more
    (body(grammar="root ::= \"a\"", json_schema={"type": "object"}), "json_schema"),  # one constraint per request
]


@pytest.mark.parametrize("given, param", BEYOND_THE_SCHEMA, ids=[p for _, p in BEYOND_THE_SCHEMA])
def test_rules_between_fields_are_400s_naming_the_field(given, param):
    assert _validator(vocab_size=VOCAB, max_model_len=CONTEXT).is_valid(given)
    with pytest.raises((ApiError, OutOfBounds)) as e:
        _run(given)
    assert e.value.param == param


def test_the_document_before_a_worker_is_ready_bounds_ids_statically():
    """Before a worker reports the vocabulary, a token id as text is any decimal id up to the static bound."""
    validator = _validator()
    assert validator.is_valid(body(logit_bias={"2147483647": 1}))
    assert not validator.is_valid(body(logit_bias={"2147483648": 1}))
    assert validator.is_valid(body(logit_bias={"any text": 1}))


def test_infill_is_described_only_for_a_model_that_can_fill_in_the_middle():
    paths = document(ServedBounds(("m",), LIMITS, infill=False))["paths"]
    assert {"/completion", "/completions", "/props"} <= set(paths) and "/infill" not in paths
    assert "/infill" in document(ServedBounds(("m",), LIMITS, infill=True))["paths"]
    pooling = document(ServedBounds(("m",), LIMITS, task="embed", infill=True))["paths"]
    assert "/completion" not in pooling and "/infill" not in pooling and "/props" in pooling


EMBEDDING_BODIES = [
    {"content": "hi"}, {"input": [1, 2]}, {"content": "hi", "input": [1, 2]}, {}, {"content": None}, {"content": ""},
    {"content": []}, {"content": ["a", "b"]}, {"content": ["a", ""]}, {"content": [1, "a"]}, {"content": ["a", 1]},
    {"content": [[1, 2], "a", [3, "b"]]}, {"content": [["a", "b"]]}, {"content": [[]]}, {"content": [1000]},
    {"content": [-1]}, {"content": [1.0, 2]}, {"content": [1.5]}, {"content": "x", "embd_normalize": -1},
    {"content": "x", "embd_normalize": -2}, {"content": "x", "embd_normalize": 7}, {"content": "x", "model": "any"},
    {"content": ["x"] * 2049},
]


@pytest.mark.parametrize("given", EMBEDDING_BODIES, ids=[str(i) for i in range(len(EMBEDDING_BODIES))])
def test_embedding_document_and_server_agree(given):
    try:
        for prompt in llama_inputs(validate(LlamaEmbeddingBody, given, ()), _tokenize):
            if isinstance(prompt, list):
                check_prompt_fits(prompt, 0, VOCAB, CONTEXT)  # what the route's prompt builder checks of ids
        accepted = True
    except (ApiError, OutOfBounds):
        accepted = False
    valid = _validator("LlamaEmbeddingBody", vocab_size=VOCAB, max_model_len=CONTEXT).is_valid(given)
    assert valid == accepted, given

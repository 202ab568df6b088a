"""text-generation-inference's own API (POST /generate, /generate_stream, / and GET /info) on the shared tiny server:
each request is the completion it translates into, so its tokens, logprobs and text are those /v1/completions gives
for the same settings (which the engine's tests hold to transformers); streamed, the tokens' texts add up to the
generated text; errors are TGI's {"error", "error_type"} with its status codes."""

from __future__ import annotations

import json

import httpx2
import pytest

from tests.helpers.sse import data_payloads, stream_lines
from tests.integration.conftest import SERVED_NAME

PROMPT = "Once upon a time"
# Two requests for the same tokens agree to float32 rounding, not bit for bit: a prefix-cache hit and the batch change
# the row counts of the float32 model's matmuls, and torch picks another kernel for a few rows than for many.
SAME_LOGPROBS = 1e-4


def _completion(server, **body) -> dict:
    """The greedy completion of PROMPT with its tokens and logprobs: what TGI's answer must match."""
    request = {"model": SERVED_NAME, "prompt": PROMPT, "temperature": 0, "logprobs": 0, "return_token_ids": True,
               **body}
    return server.answer("/v1/completions", request)["choices"][0]


def _stream(server, path: str, body: dict) -> list[dict]:
    """TGI's framing: `data:` events only, no [DONE], the last one carrying generated_text."""
    status, lines = stream_lines(f"{server.url}{path}", body)
    assert status == 200, lines
    payloads = data_payloads(lines)
    assert payloads and "[DONE]" not in payloads
    assert all(line == "" or line.startswith(("data: ", ":")) for line in lines)
    events = [json.loads(p) for p in payloads]
    assert [e["generated_text"] is not None for e in events] == [False] * (len(events) - 1) + [True]
    return events


def test_generate_is_the_completion_it_means(server):
    want = _completion(server, max_tokens=10)
    body = server.answer("/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 10, "details": True}})
    assert body["generated_text"] == want["text"]
    details = body["details"]
    assert details["generated_tokens"] == len(details["tokens"]) == len(want["token_ids"])
    assert [t["id"] for t in details["tokens"]] == want["token_ids"]
    assert [t["logprob"] for t in details["tokens"]] == pytest.approx(want["logprobs"]["token_logprobs"],
                                                                     abs=SAME_LOGPROBS)
    assert details["prefill"] == [] and details["seed"] is None and "top_tokens" not in details
    assert details["finish_reason"] in ("length", "eos_token")
    # Without details, only the text.
    assert server.answer("/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 10}}) == {
        "generated_text": want["text"]}


def test_stream_tokens_add_up_to_the_generated_text(server):
    want = server.answer("/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 12, "details": True}})
    events = _stream(server, "/generate_stream", {"inputs": PROMPT, "parameters": {"max_new_tokens": 12,
                                                                                  "details": True}})
    assert [e["index"] for e in events] == list(range(1, len(events) + 1))
    assert [e["token"]["id"] for e in events] == [t["id"] for t in want["details"]["tokens"]]
    assert [e["token"]["logprob"] for e in events] == pytest.approx(
        [t["logprob"] for t in want["details"]["tokens"]], abs=SAME_LOGPROBS)
    assert "".join(e["token"]["text"] for e in events if not e["token"]["special"]) == want["generated_text"]
    assert events[-1]["generated_text"] == want["generated_text"]
    assert all(e["details"] is None for e in events[:-1])
    assert events[-1]["details"] == {"finish_reason": want["details"]["finish_reason"],
                                     "generated_tokens": len(events), "seed": None,
                                     "input_length": len(server.answer("/tokenize", {"prompt": PROMPT})["tokens"])}
    # Without details the last event's details stay null.
    plain = _stream(server, "/generate_stream", {"inputs": PROMPT, "parameters": {"max_new_tokens": 12}})
    assert plain[-1]["details"] is None and plain[-1]["generated_text"] == want["generated_text"]


def test_stop_sequences_stay_in_the_text(server):
    full = _completion(server, max_tokens=16)
    if len(full["text"]) < 6:
        pytest.skip(f"this seed's model ends its greedy text early: {full['text']!r}")
    stop = full["text"][3:6]  # a string the greedy text holds
    body = server.answer("/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 16, "stop": [stop],
                                                                       "details": True}})
    assert body["details"]["finish_reason"] == "stop_sequence"
    assert body["generated_text"].endswith(stop) and full["text"].startswith(body["generated_text"])
    events = _stream(server, "/generate_stream", {"inputs": PROMPT, "parameters": {"max_new_tokens": 16,
                                                                                  "stop": [stop], "details": True}})
    assert events[-1]["generated_text"] == body["generated_text"]
    assert events[-1]["details"]["finish_reason"] == "stop_sequence"


def test_a_completed_grammar_ends_as_eos_token(server):
    body = server.answer("/generate", {"inputs": PROMPT, "parameters": {
        "max_new_tokens": 20, "details": True, "grammar": {"type": "regex", "value": "(yes|no)"}}})
    assert body["generated_text"] in ("yes", "no") and body["details"]["finish_reason"] == "eos_token"
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    for grammar in ({"type": "json", "value": schema}, {"type": "json", "value": json.dumps(schema)},
                    {"type": "json_schema", "value": {"name": "x", "schema": schema}}):
        text = server.answer("/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 20,
                                                                           "grammar": grammar}})["generated_text"]
        assert isinstance(json.loads(text)["ok"], bool), text


def test_compat_route_answers_a_list_with_the_prompt(server):
    want = _completion(server, max_tokens=6)["text"]
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 6}}
    assert server.answer("/", body) == [{"generated_text": PROMPT + want}]  # TGI's default there: the full text
    assert server.answer("/", body | {"parameters": {"max_new_tokens": 6, "return_full_text": False}}) == [
        {"generated_text": want}]
    assert server.answer("/generate", body | {"parameters": {"max_new_tokens": 6, "return_full_text": True}}) == {
        "generated_text": PROMPT + want}
    events = _stream(server, "/", body | {"stream": True})
    assert events[-1]["generated_text"] == PROMPT + want
    assert "".join(e["token"]["text"] for e in events if not e["token"]["special"]) == want


def test_decoder_input_details_and_top_tokens(server):
    echo = server.answer("/v1/completions", {"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 0, "echo": True,
                                              "logprobs": 0})["choices"][0]["logprobs"]
    body = server.answer("/generate", {"inputs": PROMPT, "parameters": {
        "max_new_tokens": 4, "details": True, "decoder_input_details": True, "top_n_tokens": 3}})
    prefill = body["details"]["prefill"]
    assert prefill[0]["logprob"] is None and echo["token_logprobs"][0] is None  # the first token has none
    assert [p["logprob"] for p in prefill[1:]] == pytest.approx(echo["token_logprobs"][1:], abs=SAME_LOGPROBS)
    assert "".join(p["text"] for p in prefill) == PROMPT
    tokens, top = body["details"]["tokens"], body["details"]["top_tokens"]
    assert len(top) == len(tokens) and all(len(t) == 3 for t in top)
    for token, alternatives in zip(tokens, top):  # greedy: the token is the most likely one
        assert alternatives[0]["id"] == token["id"] and alternatives[0]["logprob"] == token["logprob"]
        assert [a["logprob"] for a in alternatives] == sorted((a["logprob"] for a in alternatives), reverse=True)
    events = _stream(server, "/generate_stream", {"inputs": PROMPT, "parameters": {"max_new_tokens": 4,
                                                                                  "top_n_tokens": 2}})
    assert all(len(e["top_tokens"]) == 2 and e["top_tokens"][0]["id"] == e["token"]["id"] for e in events)


def test_sampling_follows_the_seed(server):
    def sample(seed: int, **parameters) -> str:
        return server.answer("/generate", {"inputs": PROMPT, "parameters": {
            "max_new_tokens": 12, "seed": seed, "details": True, **parameters}})

    first, again = sample(7, do_sample=True), sample(7, do_sample=True)
    assert first == again and first["details"]["seed"] == 7
    # Setting temperature turns sampling on, as TGI's warpers do.
    assert sample(7, temperature=1.5)["details"]["seed"] == 7
    assert sample(7)["details"]["seed"] is None  # greedy: no seed was used
    greedy = _completion(server, max_tokens=12)["text"]
    assert sample(7)["generated_text"] == greedy


@pytest.mark.parametrize("parameters, param", [
    ({"temperature": 0}, "parameters.temperature"),
    ({"top_p": 1.0}, "parameters.top_p"),
    ({"top_k": 0}, "parameters.top_k"),
    ({"max_new_tokens": 0}, "parameters.max_new_tokens"),
    ({"top_n_tokens": 6}, "parameters.top_n_tokens"),
    ({"typical_p": 0.5}, "parameters.typical_p"),
    ({"watermark": True}, "parameters.watermark"),
    ({"best_of": 2}, "parameters.best_of"),
    ({"adapter_id": "lora"}, "parameters.adapter_id"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "parameters.stop"),
    ({"max_new_tokens": 100000}, "parameters.max_new_tokens"),
    ({"grammar": {"type": "regex", "value": 3}}, "parameters.grammar.value"),
    ({"grammar": {"type": "json", "value": "{not json"}}, "parameters.grammar.value"),
    ({"max_new_tokens": "3"}, "parameters.max_new_tokens"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_parameters_are_tgi_validation_errors(server, parameters, param):
    body = server.answer("/generate", {"inputs": PROMPT, "parameters": parameters}, status=422)
    assert body["error_type"] == "validation" and set(body) == {"error", "error_type"}
    assert param in body["error"], body


def test_bad_bodies_and_streams(server):
    for body in ({"inputs": ""}, {"parameters": {}}, {"inputs": 3}, {"inputs": PROMPT, "stream": "yes"}):
        assert server.answer("/generate", body, status=422)["error_type"] == "validation"
    r = httpx2.post(f"{server.url}/generate", content=b"[1, 2", timeout=30)
    assert r.status_code == 422 and r.json()["error_type"] == "validation"
    # The prompt's details have no place in a stream: refused before it starts, as TGI refuses it.
    assert server.answer("/generate_stream", {"inputs": PROMPT, "parameters": {"decoder_input_details": True}},
                 status=422)["error_type"] == "validation"
    # Unknown fields are ignored, as TGI ignores them.
    assert "generated_text" in server.answer("/generate", {"inputs": PROMPT, "extra": 1, "parameters": {
        "max_new_tokens": 2, "something_new": True}})
    # The server is still serving.
    assert httpx2.get(f"{server.url}/health").status_code == 200


def test_info_says_what_is_served(server):
    info = httpx2.get(f"{server.url}/info", timeout=30).json()
    health = httpx2.get(f"{server.url}/health", timeout=30).json()
    assert info["model_id"] == SERVED_NAME and info["model_pipeline_tag"] == "text-generation"
    assert info["max_total_tokens"] == health["max_model_len"] and info["max_input_tokens"] == health[
        "max_model_len"] - 1
    assert info["max_stop_sequences"] == 4 and info["max_best_of"] == 1 and info["model_dtype"] == health["dtype"]

"""llama.cpp server's own API (POST /completion and /completions, GET /props) on the shared tiny server: each
request is the completion it translates into, so its text, tokens and probabilities are those /v1/completions gives
for the same settings (which the engine's tests hold to transformers); streamed, the events' contents and tokens add
up to the whole answer and the last event says stop; errors name llama.cpp's fields."""

from __future__ import annotations

import json
import math

import httpx2
import pytest

from tests.helpers.sse import data_payloads, stream_lines
from tests.integration.conftest import SERVED_NAME

PROMPT = "Once upon a time"
SAME_LOGPROBS = 1e-4  # as in test_tgi_api.py: a prefix-cache hit changes the float32 matmuls' row counts


def _completion(server, **body) -> dict:
    request = {"model": SERVED_NAME, "prompt": PROMPT, "temperature": 0, "logprobs": 2, "return_token_ids": True,
               **body}
    return server.answer("/v1/completions", request)


def _stream(server, body: dict) -> list[dict]:
    """llama.cpp's framing: `data:` events, no [DONE], the last one (and only it) with stop true and no content."""
    status, lines = stream_lines(f"{server.url}/completion", {**body, "stream": True})
    assert status == 200, lines
    payloads = data_payloads(lines)
    assert payloads and "[DONE]" not in payloads
    events = [json.loads(p) for p in payloads]
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    assert events[-1]["content"] == ""
    return events


@pytest.mark.parametrize("path", ["/completion", "/completions"])
def test_greedy_completion_is_the_completion_it_means(server, path):
    want = _completion(server, max_tokens=12)
    choice = want["choices"][0]
    body = server.answer(path, {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "return_tokens": True})
    assert body["content"] == choice["text"] and body["tokens"] == choice["token_ids"]
    assert body["stop"] is True and body["model"] == SERVED_NAME and body["prompt"] == PROMPT
    assert body["tokens_predicted"] == want["usage"]["completion_tokens"]
    assert body["tokens_evaluated"] == want["usage"]["prompt_tokens"]
    assert body["stop_type"] == ("limit" if choice["finish_reason"] == "length" else "eos")
    assert body["has_new_line"] == ("\n" in choice["text"]) and body["truncated"] is False
    assert body["generation_settings"]["n_predict"] == 12 and body["generation_settings"]["temperature"] == 0
    timings = body["timings"]
    assert timings["predicted_n"] == body["tokens_predicted"] and timings["prompt_ms"] >= 0
    assert "completion_probabilities" not in body
    # Token ids as the prompt: the same answer.
    by_ids = server.answer(path, {"prompt": want["choices"][0]["prompt_token_ids"], "n_predict": 12,
                                  "temperature": 0})
    assert by_ids["content"] == choice["text"] and by_ids["tokens"] == []  # tokens only with return_tokens


def test_probabilities_are_the_completions_logprobs(server):
    choice = _completion(server, max_tokens=8)["choices"][0]
    body = server.answer("/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "n_probs": 2})
    probs = body["completion_probabilities"]
    assert [p["id"] for p in probs] == choice["token_ids"][:len(probs)]
    assert len(probs) == len(choice["token_ids"]) - (body["stop_type"] == "eos")  # the end token is left out
    assert [p["logprob"] for p in probs] == pytest.approx(choice["logprobs"]["token_logprobs"][:len(probs)],
                                                          abs=SAME_LOGPROBS)
    for p, top in zip(probs, choice["logprobs"]["top_logprobs"]):
        assert len(p["top_logprobs"]) == 2 and p["top_logprobs"][0]["id"] == p["id"]  # greedy: the top is taken
        assert {e["token"]: e["logprob"] for e in p["top_logprobs"]} == pytest.approx(top, abs=SAME_LOGPROBS)
        assert bytes(p["bytes"]).decode("utf-8", "replace") == p["token"] or "\ufffd" in p["token"]


def test_stream_adds_up_to_the_whole_answer(server):
    body = {"prompt": PROMPT, "n_predict": 16, "temperature": 0, "return_tokens": True, "n_probs": 1}
    whole = server.answer("/completion", body)
    events = _stream(server, body)
    assert "".join(e["content"] for e in events) == whole["content"]
    assert [t for e in events for t in e["tokens"]] == whole["tokens"]
    without = _stream(server, {**body, "return_tokens": False})  # pieces carry their ids all the same
    assert [t for e in without for t in e["tokens"]] == whole["tokens"]
    assert [p["id"] for e in events[:-1] for p in e["completion_probabilities"]] == \
        [p["id"] for p in whole["completion_probabilities"]]
    last = events[-1]
    assert last["stop_type"] == whole["stop_type"] and last["tokens_predicted"] == whole["tokens_predicted"]
    assert "timings" in last and "completion_probabilities" not in last


def test_a_stop_string_ends_the_text_as_word(server):
    text = _completion(server, max_tokens=16)["choices"][0]["text"]
    word = text[len(text) // 2:len(text) // 2 + 3]
    if not word.strip():
        pytest.skip(f"no stop string to cut at in {text!r}")
    body = server.answer("/completion", {"prompt": PROMPT, "n_predict": 16, "temperature": 0, "stop": [word]})
    assert body["stop_type"] == "word" and body["stopping_word"] == word
    assert body["content"] == text[:text.index(word)]


def test_llama_cpp_sampling_defaults_apply_and_a_seed_repeats(server):
    body = {"prompt": PROMPT, "n_predict": 12, "seed": 1234}
    first, again = server.answer("/completion", body), server.answer("/completion", body)
    assert first["content"] == again["content"]
    settings = first["generation_settings"]
    assert (settings["temperature"], settings["top_k"], settings["top_p"], settings["min_p"]) == (0.8, 40, 0.95, 0.05)
    assert settings["seed"] == 1234
    want = _completion(server, max_tokens=12, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=1234)
    assert first["content"] == want["choices"][0]["text"]


def test_logit_bias_bans_a_token_in_either_form(server):
    greedy = _completion(server, max_tokens=1)["choices"][0]["token_ids"][0]
    for bias in ([[greedy, False]], {str(greedy): False}, [[greedy, -100]]):
        body = server.answer("/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0,
                                             "return_tokens": True, "logit_bias": bias})
        assert body["tokens"] and body["tokens"][0] != greedy, bias


def test_a_gbnf_grammar_constrains_the_text(server):
    body = server.answer("/completion", {"prompt": PROMPT, "n_predict": 20, "temperature": 0,
                                         "grammar": 'root ::= "yes" | "no"'})
    assert body["content"] in ("yes", "no") and body["stop_type"] == "eos"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    body = server.answer("/completion", {"prompt": PROMPT, "n_predict": 40, "temperature": 0, "json_schema": schema})
    if body["stop_type"] == "eos":
        assert isinstance(json.loads(body["content"])["a"], int)


def test_token_ids_and_texts_mixed_are_one_prompt(server):
    """llama-server's mixed prompt, ["Once upon", <ids of " a time">], is the prompt those tokens make; a list of texts
    alone (its several prompts) is a 400 naming prompt."""
    ids = httpx2.post(f"{server.url}/tokenize", json={"content": " a time"}, timeout=30).json()["tokens"]
    want = server.answer("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "return_tokens": True})
    mixed = server.answer("/completion", {"prompt": ["Once upon", *ids], "n_predict": 6, "temperature": 0,
                                          "return_tokens": True})
    assert mixed["tokens"] == want["tokens"] and mixed["content"] == want["content"]
    r = httpx2.post(f"{server.url}/completion", json={"prompt": ["Once", "upon"], "n_predict": 2}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_apply_template_gives_the_prompt_a_chat_request_runs(server):
    """llama-server's /apply-template: the conversation as the chat template renders it; posted to /completion, it
    gives the tokens the chat request gives."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    prompt = server.answer("/apply-template", {"messages": messages})["prompt"]
    assert "Name a colour." in prompt
    counted = server.answer("/tokenize", {"messages": messages})["tokens"]
    assert httpx2.post(f"{server.url}/tokenize", json={"content": prompt}, timeout=30).json()["tokens"] == counted
    chat = server.answer("/v1/chat/completions", {"model": SERVED_NAME, "messages": messages, "max_tokens": 6,
                                                  "temperature": 0, "return_token_ids": True})
    completion = server.answer("/completion", {"prompt": prompt, "n_predict": 6, "temperature": 0,
                                               "return_tokens": True})
    assert completion["tokens"] == chat["choices"][0]["token_ids"]
    r = httpx2.post(f"{server.url}/apply-template", json={"messages": "hi"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages")


def test_response_fields_pick_the_answers_fields_as_editor_plugins_name_them(server):
    """llama.vim's and llama.vscode's response_fields: only those fields, nested ones at the top under their path, a
    missing one left out; the streamed answer's last event likewise."""
    fields = ["content", "timings/prompt_n", "timings/predicted_n", "truncated", "tokens_cached", "no/such"]
    body = {"prompt": PROMPT, "n_predict": 5, "temperature": 0}
    whole = server.answer("/completion", body)
    picked = server.answer("/completion", {**body, "response_fields": fields})
    assert set(picked) == set(fields) - {"no/such"}
    assert picked["content"] == whole["content"] and picked["truncated"] is False
    assert picked["timings/predicted_n"] == whole["timings"]["predicted_n"] == 5
    assert picked["timings/prompt_n"] + picked["tokens_cached"] == whole["tokens_evaluated"]
    status, lines = stream_lines(f"{server.url}/completion", {**body, "stream": True, "response_fields": fields})
    events = [json.loads(p) for p in data_payloads(lines)]
    assert status == 200 and set(events[-1]) == set(fields) - {"no/such"} and events[-1]["content"] == ""
    assert "".join(e["content"] for e in events) == whole["content"]


def test_without_n_predict_the_text_runs_until_it_ends(server):
    """n_predict -1 (llama.cpp's default) is no limit short of the context, not /v1/completions' default of 16
    tokens: a grammar fixes a text of more than 16 tokens, and all of it comes back, ended by the model."""
    text = " ".join(str(i) for i in range(40))
    for body in ({}, {"n_predict": -1}):
        answer = server.answer("/completion", {"prompt": PROMPT, "temperature": 0, "return_tokens": True,
                                               "grammar": f'root ::= "{text}"', **body})
        assert answer["content"] == text and answer["stop_type"] == "eos" and len(answer["tokens"]) > 16


CODE = "def f():\n    x = 1\n    return x\nprint(f())\n"  # what the grammar below makes the model write


@pytest.mark.parametrize("stream", [False, True])
def test_n_indent_ends_a_suggestion_with_its_block(server, stream):
    """A grammar fixes the text; n_indent 4 ends it before `print`, the block's indentation left intact, and the
    stream sends exactly what the whole answer keeps."""
    grammar = "root ::= " + json.dumps(CODE)
    body = {"prompt": PROMPT, "n_predict": 64, "temperature": 0, "grammar": grammar}
    assert server.answer("/completion", body)["content"] == CODE
    want = "def f():\n    x = 1\n    return x\n"
    if stream:
        events = _stream(server, {**body, "n_indent": 4})
        assert "".join(e["content"] for e in events) == want and events[-1]["stop_type"] == "limit"
    else:
        cut = server.answer("/completion", {**body, "n_indent": 4})
        assert cut["content"] == want and cut["stop_type"] == "limit"
        assert cut["tokens_predicted"] < server.answer("/completion", body)["tokens_predicted"]


def test_t_max_predict_ms_ends_a_suggestion_after_its_first_line(server):
    lines = "".join(f"line {i}\n" for i in range(30))
    body = {"prompt": PROMPT, "n_predict": 200, "temperature": 0, "grammar": "root ::= " + json.dumps(lines),
            "t_max_predict_ms": 1}
    cut = server.answer("/completion", body)
    assert cut["stop_type"] == "limit" and "\n" in cut["content"] and lines.startswith(cut["content"])
    assert len(cut["content"]) < len(lines)


def test_props_names_the_context_and_template(server):
    props = httpx2.get(f"{server.url}/props", timeout=30).json()
    assert props["default_generation_settings"]["n_ctx"] == httpx2.get(f"{server.url}/health").json()["max_model_len"]
    assert props["total_slots"] >= 1 and isinstance(props["chat_template"], str) and props["chat_template"]


@pytest.mark.parametrize("body, param", [
    ({"n_predict": 4}, "prompt"),
    ({"prompt": 3}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": PROMPT, "n_predict": 0}, "n_predict"),
    ({"prompt": PROMPT, "n_predict": -2}, "n_predict"),
    ({"prompt": PROMPT, "n_predict": 10**9}, "n_predict"),
    ({"prompt": PROMPT, "temperature": "hot"}, "temperature"),
    ({"prompt": PROMPT, "top_p": 1.5}, "top_p"),
    ({"prompt": PROMPT, "n_probs": 10**6}, "n_probs"),
    ({"prompt": PROMPT, "repeat_penalty": -1.0}, "repeat_penalty"),
    ({"prompt": PROMPT, "mirostat": 2}, "mirostat"),
    ({"prompt": PROMPT, "typical_p": 0.5}, "typical_p"),
    ({"prompt": PROMPT, "logit_bias": [[1, True]]}, "logit_bias"),
    ({"prompt": PROMPT, "logit_bias": [[1]]}, "logit_bias"),
    ({"prompt": PROMPT, "grammar": "root ::= ("}, "grammar"),
    ({"prompt": [10**9]}, "prompt"),
])
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    r = httpx2.post(f"{server.url}/completion", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    assert httpx2.get(f"{server.url}/health").status_code == 200


def test_unknown_and_idle_fields_are_ignored_as_llama_cpp_ignores_them(server):
    base = server.answer("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0})
    busy = server.answer("/completion", {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "cache_prompt": True,
                                         "id_slot": -1, "n_keep": 0, "samplers": ["top_k"], "mirostat": 0,
                                         "typical_p": 1.0, "dry_multiplier": 0.0, "repeat_last_n": 64,
                                         "something_new": {"x": 1}})
    assert busy["content"] == base["content"]
    assert not math.isnan(busy["timings"]["predicted_ms"])

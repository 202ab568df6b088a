"""Thinking controls through the real server: `reasoning_effort` (chat) and `reasoning.effort` (Responses) on
the template's enable_thinking switch, --chat-template replacing the model's template, and
--default-chat-template-kwargs under a request's own chat_template_kwargs.

The served model's own template has no thinking switch; the one given with --chat-template has (Qwen3's
shape) and also writes a `marker` variable into the prompt, so /tokenize shows which template and which
variables rendered it. The random model is steered with logit_bias onto </think> (as in test_reasoning.py):
with thinking on the prompt ends inside <think> and the first </think> closes an empty reasoning; with
thinking off the template closed the block already and every </think> is content.
"""

from __future__ import annotations

import json

import httpx2
import openai
import pytest

from tests.helpers.server import start_tagged_qwen3
from tests.helpers.sse import chunks, stream_lines
from tests.integration.conftest import SERVED_NAME

MODEL_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
FILE_TEMPLATE = (
    "{% if marker is defined %}[{{ marker }}]{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}")
ASK = [{"role": "user", "content": "think"}]
THINKING_ON, THINKING_OFF = ("", "</think></think>"), ("", "</think></think></think>")


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory):
    template_file = tmp_path_factory.mktemp("templates") / "thinking.jinja"
    template_file.write_text(FILE_TEMPLATE)
    srv, ids = start_tagged_qwen3(tmp_path_factory, "thinking-controls", ["<think>", "</think>"], MODEL_TEMPLATE,
                                  "--served-model-name", "think", "--num-kv-blocks", "64",
                                  "--chat-template", str(template_file),
                                  "--default-chat-template-kwargs", json.dumps({"marker": "server default"}))
    yield srv, ids["</think>"]
    srv.stop()


def rendered(server, **extra) -> str:
    tokens = httpx2.post(f"{server.url}/tokenize", json={"messages": ASK, **extra}, timeout=30).json()["tokens"]
    return httpx2.post(f"{server.url}/detokenize", json={"tokens": tokens}, timeout=30).json()["prompt"]


def test_the_template_file_replaces_the_models_and_default_kwargs_yield_to_the_request(thinking_server):
    server, _ = thinking_server
    assert rendered(server) == "[server default]<|im_start|>user\nthink<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert rendered(server, chat_template_kwargs={"marker": "mine"}).startswith("[mine]<|im_start|>")
    assert rendered(server, chat_template_kwargs={"enable_thinking": False}).endswith("<think>\n\n</think>\n\n")


def ask(server, close_id: int, stream: bool, **extensions) -> tuple[str | None, str]:
    """(reasoning_content, content) of a 3-token answer."""
    standard = {"model": "think", "messages": ASK, "max_tokens": 3, "logit_bias": {str(close_id): 100},
                "temperature": 0}
    extensions = {"ignore_eos": True, **extensions}
    if not stream:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        message = client.chat.completions.create(**standard, extra_body=extensions).choices[0].message
        return message.model_extra.get("reasoning_content") or "", message.content
    status, lines = stream_lines(f"{server.url}/v1/chat/completions", {**standard, **extensions, "stream": True})
    assert status == 200, lines
    deltas = [c["choices"][0]["delta"] for c in chunks(lines) if c["choices"]]
    return "".join(d.get("reasoning_content", "") for d in deltas), "".join(d.get("content") or "" for d in deltas)


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_effort_is_the_thinking_switch(thinking_server, stream):
    server, close_id = thinking_server
    for effort in ("none", "minimal"):
        assert ask(server, close_id, stream, reasoning_effort=effort) == THINKING_OFF, effort
    for effort in ("low", "medium", "high"):
        assert ask(server, close_id, stream, reasoning_effort=effort) == THINKING_ON, effort
    # The request's own template variables win over what the effort sets.
    assert ask(server, close_id, stream, reasoning_effort="none",
               chat_template_kwargs={"enable_thinking": True}) == THINKING_ON


@pytest.mark.parametrize("effort", ["none", "high"])
def test_responses_reasoning_effort_is_chats(thinking_server, effort):
    """Greedy, the same request through both APIs: the same prompt (so the same switch), the same split."""
    server, _ = thinking_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    chat = client.chat.completions.create(model="think", messages=ASK, max_tokens=8, temperature=0,
                                          reasoning_effort=effort)
    response = client.responses.create(model="think", input="think", max_output_tokens=8, temperature=0,
                                       reasoning={"effort": effort, "summary": "auto"})
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.reasoning.effort == effort
    assert response.output_text == (chat.choices[0].message.content or "")
    reasoning = [c.text for item in response.output if item.type == "reasoning" for c in item.content]
    assert "".join(reasoning) == (chat.choices[0].message.model_extra.get("reasoning_content") or "")


def test_a_model_without_a_thinking_switch_ignores_the_effort(server):
    """The shared server's template (SmolLM2's ChatML) has no switch: the same prompt, the same greedy answer."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    answers = [client.chat.completions.create(model=SERVED_NAME, messages=ASK, max_tokens=6, temperature=0,
                                              **({"reasoning_effort": effort} if effort else {}))
               for effort in (None, "none", "high")]
    assert len({(a.usage.prompt_tokens, a.choices[0].message.content) for a in answers}) == 1


@pytest.mark.parametrize("body, param", [
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"reasoning_effort": 3}, "reasoning_effort"),
])
def test_bad_reasoning_effort_is_a_400_naming_it(server, body, param):
    r = httpx2.post(f"{server.url}/v1/chat/completions",
                    json={"model": SERVED_NAME, "messages": ASK, "stream": True, **body}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx2.post(f"{server.url}/v1/responses", json={"model": SERVED_NAME, "input": "hi",
                                                        "reasoning": {"effort": body["reasoning_effort"]}}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning.effort", r.text
    # Completions have no reasoning: the field stays refused there.
    r = httpx2.post(f"{server.url}/v1/completions", json={"model": SERVED_NAME, "prompt": "hi", "reasoning_effort": "low"},
                    timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning_effort", r.text


@pytest.mark.parametrize("effort", ["none", "high"])
def test_a_constraint_applies_after_the_reasoning(thinking_server, effort):
    """guided_choice on a thinking model: with thinking on, the grammar leaves the reasoning free and constrains
    what follows </think> (steered to come at once); with thinking off, the answer starts at once."""
    server, close_id = thinking_server
    choices = ["alpha", "beta", "gamma delta"]
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    for _ in range(3):
        choice = client.chat.completions.create(
            model="think", messages=ASK, max_tokens=24, temperature=1.0, reasoning_effort=effort,
            extra_body={"guided_choice": choices, "logit_bias": {str(close_id): 100}}).choices[0]
        assert choice.finish_reason == "stop" and choice.message.content in choices, choice
        assert not choice.message.model_extra.get("reasoning_content")


def test_ollama_think_needs_a_model_that_thinks(server, thinking_server):
    """Ollama's `think`: on a model with the think tags any value runs; on one without, true or a level is Ollama's
    400, and /openapi.json says so (only false)."""
    thinker, _ = thinking_server
    for srv, model, thinks in ((thinker, "think", True), (server, SERVED_NAME, False)):
        think_schema = httpx2.get(f"{srv.url}/openapi.json").json()["components"]["schemas"]["OllamaChatBody"][
            "properties"]["think"]
        assert ("anyOf" in think_schema) == thinks and (think_schema.get("enum") == [False, None]) != thinks
        for think in (True, "high", False):
            r = httpx2.post(f"{srv.url}/api/chat", timeout=30, json={
                "model": model, "messages": ASK, "think": think, "stream": False, "options": {"num_predict": 2}})
            if thinks or think is False:
                assert r.status_code == 200 and r.json()["done"], r.text
            else:
                assert r.status_code == 400 and r.json() == {"error": f'"{model}" does not support thinking'}

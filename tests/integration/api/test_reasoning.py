"""Qwen3-style reasoning through the real server: a tokenizer with <think> tags gets reasoning_content,
and chat_template_kwargs.enable_thinking reaches the template.

The random model's output is steered with logit_bias onto the </think> token, so what the split must
produce is known: with thinking on, the prompt ends inside <think> and the first </think> closes it;
with thinking off, the template closed an empty think block already and everything is content.
"""

from __future__ import annotations

import openai
import pytest

from tests.helpers.server import start_tagged_qwen3
from tests.helpers.sse import chunks, stream_lines

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory):
    srv, ids = start_tagged_qwen3(tmp_path_factory, "thinking", ["<think>", "</think>"], TEMPLATE,
                                  "--served-model-name", "think", "--num-kv-blocks", "64")
    yield srv, ids["</think>"]
    srv.stop()


def ask(server, close_id: int, thinking: bool, stream: bool) -> tuple[str | None, str]:
    """(reasoning_content, content) of a 3-token answer."""
    standard = {"model": "think", "messages": [{"role": "user", "content": "think"}], "max_tokens": 3,
                "logit_bias": {str(close_id): 100}, "temperature": 0}
    extensions = {"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": thinking}}
    if not stream:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
        message = client.chat.completions.create(**standard, extra_body=extensions).choices[0].message
        return message.model_extra.get("reasoning_content"), message.content
    status, lines = stream_lines(f"{server.url}/v1/chat/completions", {**standard, **extensions, "stream": True})
    deltas = [c["choices"][0]["delta"] for c in chunks(lines) if c["choices"]]
    return "".join(d.get("reasoning_content", "") for d in deltas), "".join(d.get("content") or "" for d in deltas)


@pytest.mark.parametrize("stream", [False, True])
def test_reasoning_split_and_enable_thinking(thinking_server, stream):
    server, close_id = thinking_server
    # Thinking on: the prompt ends inside <think>; the first </think> ends an empty reasoning.
    assert ask(server, close_id, thinking=True, stream=stream) == ("", "</think></think>")
    # Thinking off: the template closed the think block in the prompt; every token is content.
    assert ask(server, close_id, thinking=False, stream=stream) == ("", "</think></think></think>")


@pytest.mark.parametrize("stream", [False, True])
def test_responses_reasoning_item_is_the_chat_reasoning(thinking_server, stream):
    """Greedy, the same request through /v1/responses and /v1/chat/completions: the reasoning item holds the
    chat answer's reasoning_content, the message its content (none when the answer is all reasoning)."""
    server, _ = thinking_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    chat = client.chat.completions.create(model="think", messages=[{"role": "user", "content": "think"}],
                                          max_tokens=8, temperature=0).choices[0].message
    kwargs = dict(model="think", input="think", max_output_tokens=8, temperature=0)
    if stream:
        with client.responses.stream(**kwargs) as events:
            response = list(events)[-1].response
    else:
        response = client.responses.create(**kwargs)
    reasoning = [item for item in response.output if item.type == "reasoning"]
    assert [c.text for item in reasoning for c in item.content] == ([chat.model_extra["reasoning_content"]]
                                                                    if chat.model_extra["reasoning_content"] else [])
    assert response.output_text == (chat.content or "")
    counted = response.usage.output_tokens_details.reasoning_tokens
    assert (0 < counted <= response.usage.output_tokens) if reasoning else counted == 0

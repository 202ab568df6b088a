"""Qwen's own chat templates (copies of the templates published in the models' tokenizer_config.json,
tests/fixtures/chat_templates) render a tool conversation, as the official SDK sends it back, exactly as
transformers renders the same conversation in its own convention: tool-call turns with empty content and
their arguments as objects. The SDK returns an assistant's tool-call message with `content: null` and
arguments as a JSON string; Qwen3's template reads `message.content` as a string, so the request's shape
must be translated, not passed through."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gateway.openai.parse import Limits, parse_chat
from gateway.text.chat_template import ChatTemplate

LIMITS = Limits(max_n=4, max_stop=4, max_stop_length=32)
TEMPLATES = Path(__file__).resolve().parents[2] / "fixtures" / "chat_templates"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALLS = [{"id": f"call_{i}", "type": "function",
          "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
         for i, city in enumerate(("Paris", "Rome"))]
# The second request of a round trip: the first response's message as the SDK hands it back, then the results.
SDK_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": CALLS},
    {"role": "tool", "tool_call_id": "call_0", "content": '{"temp": 21}'},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 24}'},
]


def transformers_messages() -> list[dict]:
    """The same conversation as transformers' chat-template documentation writes it."""
    messages = copy.deepcopy(SDK_MESSAGES)
    messages[2]["content"] = ""
    for call in messages[2]["tool_calls"]:
        call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return messages


@pytest.fixture(scope="module")
def hf_tokenizer():
    transformers = pytest.importorskip("transformers")
    from shared.default_model import default_model_path

    return transformers.PreTrainedTokenizerFast.from_pretrained(str(default_model_path()))


@pytest.mark.parametrize("template", ["qwen3-0.6b", "qwen2.5-7b-instruct"])
@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}])
@pytest.mark.parametrize("history", [SDK_MESSAGES, SDK_MESSAGES[:3]], ids=["results", "calls-only"])
def test_sdk_tool_conversation_renders_as_transformers(hf_tokenizer, template, kwargs, history):
    source = (TEMPLATES / f"{template}.jinja").read_text()
    request = parse_chat({"model": "m", "messages": history, "tools": TOOLS}, LIMITS)
    ours = ChatTemplate(source, "", "<|im_end|>").render(
        list(request.messages), template_kwargs=kwargs, tools=[t.as_openai() for t in request.tools.tools])
    expected = hf_tokenizer.apply_chat_template(transformers_messages()[:len(history)], tools=TOOLS,
                                                chat_template=source, tokenize=False, add_generation_prompt=True,
                                                **kwargs)
    assert ours == expected
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>' in ours

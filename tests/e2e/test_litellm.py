"""LiteLLM (the client library and proxy many agent tools route through) against the default model, as its docs
point it at an OpenAI-compatible or vLLM server (`openai/`, `hosted_vllm/` with api_base) and at an
Anthropic-compatible one (`anthropic/` with api_base): chat, streaming, tools and text completion."""

from __future__ import annotations

import json
import os

import httpx2
import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # its price table from the package, not the internet
import litellm  # noqa: E402

# LiteLLM's own use of pydantic warns (deprecated field access, ReadOnly TypedDict items); not ours to fix.
pytestmark = [pytest.mark.filterwarnings("ignore:Accessing the 'model_:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")]

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def openai_base(server):
    return f"{server.url}/v1"


@pytest.mark.parametrize("provider", ["openai", "hosted_vllm"])
def test_chat_and_its_stream_agree(openai_base, provider):
    kwargs = dict(model=f"{provider}/{MODEL}", api_base=openai_base, api_key="none", messages=ASK, max_tokens=20,
                  temperature=0)
    whole = litellm.completion(**kwargs)
    text = whole.choices[0].message.content
    assert text.strip() and whole.choices[0].finish_reason in ("stop", "length")
    assert 0 < whole.usage.completion_tokens <= 20 and whole.usage.prompt_tokens > 0
    chunks = list(litellm.completion(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_tool_call(openai_base):
    reply = litellm.completion(model=f"openai/{MODEL}", api_base=openai_base, api_key="none",
                               messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                               tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                               max_tokens=60, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}


def test_text_completion(openai_base):
    reply = litellm.text_completion(model=f"openai/{MODEL}", api_base=openai_base, api_key="none",
                                    prompt="The capital of France is", max_tokens=10, temperature=0)
    assert reply.choices[0].text.strip() and reply.usage.completion_tokens <= 10


def test_anthropic_provider_through_messages(server):
    """LiteLLM's anthropic/ provider posts to {api_base}/v1/messages with Anthropic's headers and stream events."""
    kwargs = dict(model=f"anthropic/{MODEL}", api_base=server.url, api_key="none", messages=ASK, max_tokens=20,
                  temperature=0)
    whole = litellm.completion(**kwargs)
    text = whole.choices[0].message.content
    assert text.strip() and 0 < whole.usage.completion_tokens <= 20
    streamed = "".join(c.choices[0].delta.content or "" for c in litellm.completion(**kwargs, stream=True)
                       if c.choices)
    assert streamed == text


@pytest.mark.parametrize("provider", ["openai", "hosted_vllm", "anthropic"])
def test_a_prompt_past_the_context_is_litellms_context_window_error(server, provider):
    """Each provider's 400 is worded as its API words a context overflow (OpenAI's code and vLLM's message;
    Anthropic's "prompt is too long"), which LiteLLM maps to ContextWindowExceededError: what its context-window
    fallbacks and callers that trim act on."""
    context = httpx2.get(f"{server.url}/health", timeout=10).json()["max_model_len"]
    base = server.url if provider == "anthropic" else f"{server.url}/v1"
    kwargs = dict(model=f"{provider}/{MODEL}", api_base=base, api_key="none", max_tokens=5, num_retries=0)
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(**kwargs, messages=[{"role": "user", "content": "hello " * (context + 100)}])
    with pytest.raises(litellm.ContextWindowExceededError):
        litellm.completion(**{**kwargs, "max_tokens": context}, messages=ASK)
    assert litellm.completion(**kwargs, messages=ASK).choices[0].message.content

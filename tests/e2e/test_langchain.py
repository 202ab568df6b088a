"""LangChain's OpenAI integration (langchain-openai, built on the openai SDK) against the default model, as its
docs use it: ChatOpenAI with a base_url, streamed with usage, structured output by each of its three methods,
tools bound and answered, the Responses API, and the completions-era OpenAI LLM."""

from __future__ import annotations

import httpx2
import pydantic
import pytest
from langchain_core.exceptions import ContextOverflowError
from langchain_core.messages import AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI, OpenAI

MODEL = "SmolLM2-135M-Instruct"
ASK = "What is the capital of France? Reply in JSON with the keys country and capital."


class Capital(pydantic.BaseModel):
    """A country and its capital."""

    country: str = pydantic.Field(max_length=40)
    capital: str = pydantic.Field(max_length=40)


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    return f"Sunny and 24 C in {city}"


@pytest.fixture(scope="module")
def chat(server):
    return ChatOpenAI(model=MODEL, base_url=f"{server.url}/v1", api_key="none", temperature=0, max_tokens=40,
                      max_retries=0, timeout=120)


def _joined(chunks) -> AIMessageChunk:
    total = None
    for chunk in chunks:
        total = chunk if total is None else total + chunk
    return total


def test_invoke_reports_text_finish_and_usage(chat):
    reply = chat.invoke([SystemMessage("Be brief."), HumanMessage("What is the capital of France?")])
    assert reply.content.strip()
    assert reply.response_metadata["finish_reason"] in ("stop", "length")
    assert reply.response_metadata["model_name"] == MODEL
    usage = reply.usage_metadata
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 40
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_stream_adds_up_to_the_whole_reply_with_usage(chat):
    whole = chat.invoke("Say hello.")
    streamed = _joined(chat.bind(stream_options={"include_usage": True}).stream("Say hello."))
    assert streamed.content == whole.content
    assert streamed.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_structured_output_parses_into_the_model(chat, method):
    out = chat.with_structured_output(Capital, method=method, include_raw=True).invoke(ASK)
    assert out["parsing_error"] is None
    assert isinstance(out["parsed"], Capital) and out["parsed"].capital


def test_bound_tool_is_called_and_its_result_answered(chat):
    bound = chat.bind_tools([get_weather], tool_choice="get_weather")
    question = HumanMessage("What is the weather in Paris?")
    call_msg = bound.invoke([question])
    assert not call_msg.invalid_tool_calls
    [call] = call_msg.tool_calls[:1]
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str) and call["id"]
    answer = chat.bind_tools([get_weather]).invoke(
        [question, call_msg, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])])
    assert answer.content.strip() or answer.tool_calls  # the history (assistant tool call, tool result) was accepted


def test_streamed_tool_call_assembles(chat):
    streamed = _joined(chat.bind_tools([get_weather], tool_choice="required").stream("Weather in Rome?"))
    assert not streamed.invalid_tool_calls
    assert streamed.tool_calls and streamed.tool_calls[0]["name"] == "get_weather"
    assert isinstance(streamed.tool_calls[0]["args"]["city"], str)


def test_logprobs_ride_along(chat):
    reply = chat.bind(logprobs=True, top_logprobs=2).invoke("Hi")
    content = reply.response_metadata["logprobs"]["content"]
    assert len(content) == reply.usage_metadata["output_tokens"]
    assert all(len(entry["top_logprobs"]) == 2 for entry in content)


def test_responses_api(server):
    chat = ChatOpenAI(model=MODEL, base_url=f"{server.url}/v1", api_key="none", temperature=0, max_tokens=20,
                      use_responses_api=True, max_retries=0, timeout=120)
    reply = chat.invoke("Hi")
    assert reply.text.strip()
    assert reply.usage_metadata["output_tokens"] <= 20


def test_completions_llm(server):
    llm = OpenAI(model=MODEL, base_url=f"{server.url}/v1", api_key="none", temperature=0, max_tokens=10,
                 max_retries=0, timeout=120)
    assert llm.invoke("The capital of France is").strip()


def test_a_prompt_past_the_context_is_langchains_context_overflow(server, chat):
    """The 400 carries OpenAI's code context_length_exceeded, which LangChain turns into its ContextOverflowError
    (what trimming and summarizing middleware catch), streamed or not; the server then answers as before."""
    context = httpx2.get(f"{server.url}/health", timeout=10).json()["max_model_len"]
    too_long = "hello " * (context + 100)
    with pytest.raises(ContextOverflowError, match="maximum context length is"):
        chat.invoke(too_long)
    with pytest.raises(ContextOverflowError):
        list(chat.stream(too_long))
    with pytest.raises(ContextOverflowError):  # room for 5 prompt tokens, and the chat template alone has more
        chat.bind(max_tokens=context - 5).invoke("Hi")
    assert chat.invoke("Hi").text.strip()

"""The OpenAI Agents SDK (`openai-agents`, built on the openai SDK's Responses client) running its agent loop
against `mili serve`: a function tool called, run and answered across turns, streamed and not, and a typed
final output. What it sends (instructions, tools, tool_choice, the items of earlier turns, text.format) is what
agent code sends; nothing here is MILI-specific."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import pydantic
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from tests.e2e.conftest import MODEL

set_tracing_disabled(True)  # the SDK would export traces to OpenAI's servers
QUESTION = "What is the weather like in Paris today?"


class Capital(pydantic.BaseModel):
    country: str = pydantic.Field(max_length=40)
    capital: str = pydantic.Field(max_length=40)
    continent: Literal["Africa", "Asia", "Europe", "North America", "South America", "Oceania"]


def model(server) -> OpenAIResponsesModel:
    # A client per run: an async client belongs to the event loop it first ran on.
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
    return OpenAIResponsesModel(model=MODEL, openai_client=client)


def weather_agent(server, calls: list[str]) -> Agent:
    @function_tool
    def get_weather(city: Annotated[str, pydantic.Field(max_length=40)]) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return "sunny, 24 C"

    # The first turn must call the tool; the SDK then resets tool_choice, and the model answers with the result.
    return Agent(name="weather", instructions="You answer questions about the weather.", tools=[get_weather],
                 model=model(server), model_settings=ModelSettings(tool_choice="required", temperature=0,
                                                                   max_tokens=400))


async def run(agent: Agent, question: str, stream: bool):
    if not stream:
        return await Runner.run(agent, question, max_turns=4)
    result = Runner.run_streamed(agent, question, max_turns=4)
    async for _ in result.stream_events():
        pass
    return result


@pytest.mark.parametrize("stream", [False, True])
def test_tool_loop(server, stream):
    calls: list[str] = []
    result = asyncio.run(run(weather_agent(server, calls), QUESTION, stream))
    kinds = [type(item).__name__ for item in result.new_items]
    assert calls and all(isinstance(city, str) and city for city in calls)
    assert kinds.count("ToolCallItem") == kinds.count("ToolCallOutputItem") == len(calls)
    assert kinds[-1] == "MessageOutputItem" and isinstance(result.final_output, str)
    print(calls, repr(result.final_output))


def test_streamed_run_is_the_same_run(server):
    """Greedy: the streamed loop makes the same calls and ends with the same answer."""
    outcomes = []
    for stream in (False, True):
        calls: list[str] = []
        result = asyncio.run(run(weather_agent(server, calls), QUESTION, stream))
        outcomes.append((calls, [type(item).__name__ for item in result.new_items], result.final_output))
    assert outcomes[0] == outcomes[1]


def test_typed_final_output(server):
    agent = Agent(name="geography", instructions="Reply in JSON.", output_type=Capital, model=model(server),
                  model_settings=ModelSettings(temperature=0, max_tokens=120))
    result = asyncio.run(run(agent, "What is the capital of France?", stream=False))
    assert isinstance(result.final_output, Capital)

"""The request bodies of Ollama's API (POST /api/chat, /api/generate, /api/show), as typed models.

Unknown fields and unknown `options` are ignored, as Ollama's server ignores them (it logs and goes on), so that
clients written for its newer or older versions keep working. The options that steer loading (`num_ctx`,
`num_gpu`, `num_thread`, `use_mmap`, ...) and `keep_alive` are accepted and change nothing: the model is loaded
once, with the server's own flags. Sampling options map onto the chat endpoint's fields (gateway/ollama/to_chat.py),
whose bounds apply (shared/request_limits.py) and are stated here, so that /openapi.json describes the routes
truly. Types are strict, as Ollama's own decoding is: a number sent as a string is a 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, WithJsonSchema

from gateway.openai.schema import (FunctionDefinition, Logprobs, MinP, OllamaBody, OllamaModelName, RepetitionPenalty,
                                   Seed, StopString, Temperature, TopK, TopP, _float, _integral, _limit)
from shared.request_limits import FREQUENCY_PENALTY, PRESENCE_PENALTY


# The most tokens to generate, within the context; 0 or a negative number is Ollama's "until the context ends".
NumPredict = Annotated[int, Field(json_schema_extra=_limit("context")), BeforeValidator(_integral)]


def _empty_only(why: str, json_type: str) -> Any:
    """A field accepted only empty (Ollama's clients send some of them as [] or ""): anything else is a 400 saying
    `why`, and the schema says maxItems / maxLength 0."""

    def check(value: Any) -> Any:
        if value:
            raise ValueError(why)
        return value

    bound = {"array": "maxItems", "string": "maxLength"}[json_type]
    return Annotated[list[Any] if json_type == "array" else str, AfterValidator(check),
                     WithJsonSchema({"type": json_type, bound: 0, "description": why})]


NoImages = _empty_only("images are not supported (this server serves a text-only model)", "array")
NoTemplate = _empty_only("template is not supported (the model's own chat template is used)", "string")
NoContext = _empty_only("context is not supported: send the conversation as /api/chat messages", "array")


class OllamaOptions(OllamaBody):
    """The runtime options MILI honours; the rest are ignored (Ollama's own removed mirostat, tfs_z and
    penalize_newline the same way)."""

    num_predict: NumPredict | None = Field(None, description="the most tokens to generate; 0 or negative: until "
                                                             "the context ends")
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = Field(None, description="0 or -1: off")
    min_p: MinP | None = None
    seed: Seed | None = None
    stop: Annotated[list[StopString], Field(json_schema_extra=_limit("stop_count"))] | None = None
    repeat_penalty: RepetitionPenalty | None = Field(None, description="vLLM's repetition_penalty")
    presence_penalty: _float(PRESENCE_PENALTY) | None = None
    frequency_penalty: _float(FREQUENCY_PENALTY) | None = None


class OllamaToolCallFunction(OllamaBody):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class OllamaToolCall(OllamaBody):
    id: str | None = None
    function: OllamaToolCallFunction


class OllamaMessage(OllamaBody):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    thinking: str | None = Field(None, description="an assistant turn's reasoning (dropped, as templates drop it)")
    images: NoImages | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = Field(None, description="on a tool result: the tool it came from")
    tool_call_id: str | None = None


class OllamaTool(OllamaBody):
    type: Literal["function"] = "function"
    function: FunctionDefinition  # chat's: a name, a description, the arguments' JSON schema


Format = Union[Literal["", "json"], dict[str, Any]]
Think = Union[bool, Literal["low", "medium", "high"]]


class _Generating(OllamaBody):
    model: OllamaModelName
    stream: bool = Field(True, description="Ollama streams by default: newline-delimited JSON objects")
    format: Format | None = Field(None, description='"json", or a JSON schema the output follows')
    options: OllamaOptions | None = None
    keep_alive: Union[str, float, int, None] = None
    think: Think | None = Field(None, description="true or a level: the template's thinking switch on; a model "
                                "without thinking (no \"thinking\" capability in /api/show) takes only false",
                                json_schema_extra=_limit("think"))
    logprobs: bool | None = None
    top_logprobs: Logprobs | None = None


class OllamaChatBody(_Generating):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[OllamaTool] | None = None


class OllamaGenerateBody(_Generating):
    prompt: str = ""
    system: str | None = None
    suffix: str | None = Field(None, description="the text after the insertion point: fill in the middle (a model "
                                                 "with fill-in-the-middle tokens; no template)")
    raw: bool = Field(False, description="the prompt as it is, without the chat template")
    images: NoImages | None = None
    template: NoTemplate | None = None
    context: NoContext | None = None


class _NamingModel(OllamaBody):
    """A body that names a model as `model` or, in older clients, `name`."""

    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"required": [field], "properties": {field: {"type": "string"}}} for field in ("model", "name")]})

    model: OllamaModelName | None = None
    name: str | None = Field(None, min_length=1, description="the older clients' name for model (one of the two is "
                                                             "required; model wins)")


class OllamaPullBody(_NamingModel):
    """POST /api/pull: the served model is already here (a success at once); MILI downloads no other."""

    insecure: bool | None = None
    stream: bool = Field(True, description="true (Ollama's default): the status as one newline-delimited JSON line")


class OllamaShowBody(_NamingModel):
    verbose: bool | None = None


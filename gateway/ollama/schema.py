"""The request bodies of Ollama's API (POST /api/chat, /api/generate, /api/show), as typed models.

Unknown fields and unknown `options` are ignored, as Ollama's server ignores them (it logs and goes on), so that
clients written for its newer or older versions keep working. The options that steer loading (`num_ctx`,
`num_gpu`, `num_thread`, `use_mmap`, ...) and `keep_alive` are accepted and change nothing: the model is loaded
once, with the server's own flags. Sampling options map onto the chat endpoint's fields (gateway/ollama/to_chat.py),
whose bounds apply (shared/request_limits.py).
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Options(_Model):
    """The runtime options MILI honours; the rest are ignored (Ollama's own removed mirostat, tfs_z and
    penalize_newline the same way)."""

    num_predict: int | None = Field(None, description="the most tokens to generate; -1 and -2: until the context ends")
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    repeat_penalty: float | None = Field(None, description="vLLM's repetition_penalty")
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class ToolCallFunction(_Model):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(_Model):
    id: str | None = None
    function: ToolCallFunction


class Message(_Model):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    thinking: str | None = Field(None, description="an assistant turn's reasoning (dropped, as templates drop it)")
    images: list[Any] | None = Field(None, description="refused: the served model reads text only")
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = Field(None, description="on a tool result: the tool it came from")
    tool_call_id: str | None = None


class Tool(_Model):
    type: Literal["function"] = "function"
    function: dict[str, Any]


Format = Union[Literal["", "json"], dict[str, Any]]
Think = Union[bool, Literal["low", "medium", "high"]]


class _Generating(_Model):
    model: str = Field(min_length=1)
    stream: bool = Field(True, description="Ollama streams by default: newline-delimited JSON objects")
    format: Format | None = Field(None, description='"json", or a JSON schema the output follows')
    options: Options | None = None
    keep_alive: Union[str, float, int, None] = None
    think: Think | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class ChatBody(_Generating):
    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] | None = None


class GenerateBody(_Generating):
    prompt: str = ""
    system: str | None = None
    suffix: str | None = Field(None, description="refused unless empty: no fill-in-the-middle template")
    raw: bool = Field(False, description="the prompt as it is, without the chat template")
    images: list[Any] | None = None
    template: str | None = Field(None, description="refused unless empty: the model's own template is used")
    context: list[int] | None = Field(None, description="a previous response's context: the conversation so far")


class ShowBody(_Model):
    model: str | None = None
    name: str | None = Field(None, description="the older clients' name for model")
    verbose: bool | None = None


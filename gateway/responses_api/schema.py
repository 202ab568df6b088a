"""The request body of POST /v1/responses (OpenAI's Responses API) as typed models.

MILI serves the API as the Chat Completions API it translates into (gateway/responses_api/to_chat.py): the
conversation comes whole in `input` (an agent loop sends `response.output` back in, followed by its tool results),
or continues a stored response named by `previous_response_id` (gateway/responses_api/store.py). What needs more
state (`conversation`, `background`) is refused with a 400 naming the field. Of OpenAI's hosted tools, web search is
accepted and not offered to the model (agent clients such as Codex send it by default; MILI runs no hosted tool);
the others are refused. Models are strict and forbid unknown fields, as the other endpoints'
(gateway/openai/schema.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import ConfigDict, Discriminator, Field, Tag, create_model, field_validator

from gateway.openai.schema import (PRIORITY_DESCRIPTION, PROMPT_CACHE_RETENTION, FunctionCall, JsonObjectFormat,
                                   Logprobs, MaxCompletionTokens, MinP, Priority, PromptCacheRetention, ReasoningEffort,
                                   RepetitionPenalty, Seed, Temperature, TextFormat, TopK, TopP, _limit, _Model, _needs,
                                   _when)
from shared.request_limits import MAX_TOOLS, NAME_PATTERN


# ----- input items -----
class InputText(_Model):
    type: Literal["input_text"]
    text: str


class OutputText(_Model):
    """A part of an assistant message sent back from an earlier response (annotations and logprobs dropped)."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(_Model):
    type: Literal["refusal"]
    refusal: str


InputPart = Annotated[Union[InputText, OutputText, Refusal], Field(discriminator="type")]


class MessageItem(_Model):
    """A turn: `{"role", "content"}` (an "easy input message") or the same with `type: "message"`, as an
    earlier response's output item carries it (with its id and status)."""

    type: Literal["message"] | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: Union[str, list[InputPart]]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class FunctionCallItem(_Model):
    """A call the model made, sent back before its result."""

    type: Literal["function_call"]
    call_id: str
    name: str
    namespace: str | None = Field(None, description="the tool namespace the function was declared in")
    arguments: str = Field(description="a JSON value, as text")
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @field_validator("arguments")
    @classmethod
    def _json(cls, value: str) -> str:
        return FunctionCall(name="", arguments=value).arguments  # the same check as a chat tool call's


class FunctionCallOutputItem(_Model):
    type: Literal["function_call_output"]
    call_id: str = Field(description="the call this result answers")
    output: Union[str, list[InputText]]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class ReasoningText(_Model):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Model):
    """An earlier response's reasoning, sent back: accepted and left out of the prompt (chat templates drop the
    reasoning of earlier turns too)."""

    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


def item_kind(item: Any) -> Any:
    """An input item's type: a message may leave it out (`{"role", "content"}`)."""
    if isinstance(item, dict):
        return item.get("type") or "message"  # absent, or null
    return getattr(item, "type", None) or "message"


InputItem = Annotated[Union[
    Annotated[MessageItem, Tag("message")], Annotated[FunctionCallItem, Tag("function_call")],
    Annotated[FunctionCallOutputItem, Tag("function_call_output")], Annotated[ReasoningItem, Tag("reasoning")],
], Discriminator(item_kind)]


# ----- tools and formats -----
class FunctionTool(_Model):
    type: Literal["function"]
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="JSON schema of the arguments")
    strict: bool | None = None


class NamespaceTool(_Model):
    """Function tools grouped under a name (OpenAI's tool namespaces): the model is offered the functions, and a
    call of one carries the namespace back."""

    type: Literal["namespace"]
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    tools: Annotated[list[FunctionTool], Field(min_length=1, max_length=MAX_TOOLS)]


class WebSearchTool(_Model):
    """OpenAI's hosted web search: accepted (Codex sends it by default) and not offered to the model, since MILI runs
    no hosted tool; its settings change nothing."""

    type: Literal["web_search", "web_search_preview"]
    external_web_access: bool | None = None
    filters: dict[str, Any] | None = None
    search_context_size: Literal["low", "medium", "high"] | None = None
    user_location: dict[str, Any] | None = None


Tool = Annotated[Union[FunctionTool, NamespaceTool, WebSearchTool], Field(discriminator="type")]


class FunctionChoice(_Model):
    type: Literal["function"]
    name: str


class JsonSchemaTextFormat(_Model):
    type: Literal["json_schema"]
    name: str = Field(pattern=NAME_PATTERN)
    schema_: dict[str, Any] = Field(alias="schema", description="a JSON schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Model):
    format: Annotated[Union[TextFormat, JsonObjectFormat, JsonSchemaTextFormat],
                      Field(discriminator="type")] | None = None
    verbosity: Literal["medium"] | None = Field(None, description="only the default is served")


class ReasoningConfig(_Model):
    effort: ReasoningEffort | None = Field(
        None, description="none/minimal: thinking off, low/medium/high: on (as chat's reasoning_effort)")
    summary: Literal["auto", "concise", "detailed"] | None = Field(
        None, description="accepted; the reasoning comes whole as reasoning_text, never summarized")


class ResponseStreamOptions(_Model):
    include_obfuscation: bool | None = Field(None, description="accepted; MILI's events are not padded")


class ResponsesBody(_Model):
    model_config = ConfigDict(json_schema_extra={"allOf": [
        # A call the model must make needs a function it is offered (flat or in a namespace; hosted tools are not).
        _when("tool_choice", {"anyOf": [{"const": "required"}, {"type": "object"}]},
              _needs("tools", {"type": "array", "minItems": 1, "contains": {
                  "type": "object", "required": ["type"],
                  "properties": {"type": {"enum": ["function", "namespace"]}}}}))]})

    model: str = Field(description="the served model name (GET /v1/models); any other is a 404",
                       json_schema_extra=_limit("model"))
    # The array first: a bad item's own error is the one reported.
    input: Union[Annotated[list[InputItem], Field(min_length=1)], Annotated[str, Field(min_length=1)]] = Field(
        description="the whole conversation: text (one user turn), or messages, function calls and their outputs")
    instructions: str | None = Field(None, description="a system message before the input")
    max_output_tokens: MaxCompletionTokens | None = Field(
        None, description="reasoning included; the rendered prompt + this must fit the model's context")
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool | None = Field(None, description="true: the response is text/event-stream of typed events")
    stream_options: ResponseStreamOptions | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], FunctionChoice] | None = Field(
        None, description="required needs tools; a named function must be one of tools")
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    # Extensions, as vLLM names them.
    seed: Seed | None = None
    top_k: TopK | None = Field(None, description="0 or -1: off")
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    ignore_eos: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="passed to the chat template")
    priority: Priority | None = Field(None, description=PRIORITY_DESCRIPTION)
    # Accepted, no effect (metadata is echoed in the response).
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: PromptCacheRetention | None = Field(None, description=PROMPT_CACHE_RETENTION)
    metadata: dict[str, str] | None = None
    client_metadata: dict[str, Any] | None = Field(None, description="accepted (Codex sends its session ids); "
                                                                     "not echoed")
    service_tier: str | None = None
    store: bool | None = Field(None, description="default true: the response is kept for previous_response_id and "
                                                 "GET /v1/responses/{id} (false on a server that keeps none)")
    truncation: Literal["disabled"] | None = Field(None, description="a prompt that does not fit is a 400")
    # What needs stored state or hosted tools: only the values that mean "not used" are accepted.
    previous_response_id: str | None = Field(
        None, description="a stored response this one continues: its conversation's items come before the input "
                          "(its instructions do not); unknown is a 404")
    conversation: None = None
    background: Literal[False] | None = None
    reasoning: ReasoningConfig | None = None
    prompt: None = None
    max_tool_calls: None = None
    moderation: None = None
    prompt_cache_options: None = None
    context_management: None = None
    background_options: None = None
    access_programs: None = None
    image: None = None
    include: list[Literal["message.output_text.logprobs", "reasoning.encrypted_content"]] | None = Field(
        None, description="message.output_text.logprobs: the message's token logprobs; "
                          "reasoning.encrypted_content: accepted (reasoning comes as plain text, and none is stored)")
    top_logprobs: Logprobs | None = Field(None, description="alternatives per token, with "
                                                            "include: [message.output_text.logprobs]")


# POST /v1/responses/input_tokens: the fields of a Responses request that make its prompt, as they are there.
PROMPT_FIELDS = ("input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "reasoning",
                "previous_response_id", "truncation", "conversation")


class _InputTokensBase(_Model):
    model_config = ConfigDict(json_schema_extra=ResponsesBody.model_config["json_schema_extra"])


InputTokensBody = create_model(
    "InputTokensBody", __base__=_InputTokensBase, __doc__="A Responses request's prompt, to count its tokens.",
    model=(Annotated[str, Field(json_schema_extra=_limit("model"))] | None,
           Field(None, description="the served model name (any other is a 404); absent: the served model")),
    personality=(None, Field(None, description="only unset: no style presets are served")),
    **{name: (ResponsesBody.model_fields[name].annotation, ResponsesBody.model_fields[name])
       for name in PROMPT_FIELDS})

UNSUPPORTED = ("conversation", "background", "prompt", "max_tool_calls", "moderation",
               "prompt_cache_options", "context_management", "background_options", "access_programs", "image",
               "personality")
LOGPROBS = "message.output_text.logprobs"

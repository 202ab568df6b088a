"""The request bodies of POST /v1/messages and POST /v1/messages/count_tokens (Anthropic's Messages API) as typed
models, for validation and for the OpenAPI document.

Known fields are strict, as the other endpoints' are. Unknown fields are ignored rather than refused: Anthropic's
clients (Claude Code above all) send fields that steer Anthropic's own service (`cache_control`, `citations`,
`context_management`, `service_tier`, ...), and a local server that refused them would refuse those clients.
Blocks a text-only server cannot honour (image, a PDF document, server tools) are a 400 naming the block
(gateway/anthropic/to_chat.py). Sampling knobs the SDK no longer types (`temperature`, `top_p`, `top_k`) are read
from the body, where `extra_body` puts them; their bounds are the chat endpoint's (shared/request_limits.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from gateway.openai.schema import MaxCompletionTokens, StopString, Temperature, TopK, TopP, _int, _limit
from shared.request_limits import MAX_TOOLS, NAME_PATTERN, THINKING_BUDGET_TOKENS


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


def _text_or(blocks: Any) -> Any:
    """A string, or an array of `blocks`: told apart by the value's type, so a problem inside a block is
    reported there (not as "not a string")."""
    return Annotated[Union[Annotated[str, Tag("text")], Annotated[list[blocks], Tag("blocks")]],
                     Discriminator(lambda v: "text" if isinstance(v, str) else "blocks")]


def block_type(node: Any) -> Any:
    """A content block's tag (its type), as gateway/openai/validation.py walks a discriminated union."""
    return node.get("type") if isinstance(node, dict) else None


class _Open(BaseModel):
    """A block MILI refuses or drops: only its type is read."""

    model_config = ConfigDict(strict=True, extra="allow")


# ----- content blocks -----
class TextBlock(_Model):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Model):
    """A call the model made, sent back before its result."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class RefusedBlock(_Open):
    """A block a text-only server cannot serve: a 400 that names it."""

    type: Literal["image", "server_tool_use", "web_search_tool_result", "container_upload"]


class TextSource(_Model):
    """A plain-text document."""

    type: Literal["text"]
    media_type: Literal["text/plain"] = "text/plain"
    data: str


class ContentSource(_Model):
    """A document given as content: a string or text blocks (an image block in it is a 400)."""

    type: Literal["content"]
    content: _text_or(Annotated[Union[TextBlock, RefusedBlock], Field(discriminator="type")])


class RefusedSource(_Open):
    """A PDF (base64), a URL or an uploaded file: not read by a text-only server, a 400 that names it."""

    type: Literal["base64", "url", "file"]


class Citations(_Model):
    enabled: bool = False


class SearchResultBlock(_Model):
    """A search result the caller's own search found (title, source and text blocks), read as text like a document."""

    type: Literal["search_result"]
    source: str
    title: str
    content: list[TextBlock]
    citations: Citations | None = Field(None, description="only disabled: the response has no citation blocks")


class DocumentBlock(_Model):
    """A text document the model reads (title, context and text), as the turn's text where the block stands."""

    type: Literal["document"]
    source: Annotated[Union[TextSource, ContentSource, RefusedSource], Field(discriminator="type")]
    title: str | None = None
    context: str | None = None
    citations: Citations | None = Field(None, description="only disabled: the response has no citation blocks")


class ToolResultBlock(_Model):
    type: Literal["tool_result"]
    tool_use_id: str
    content: _text_or(Annotated[Union[TextBlock, DocumentBlock, SearchResultBlock, RefusedBlock],
                                Field(discriminator="type")]) = ""
    is_error: bool | None = None


class ThinkingBlock(_Model):
    """Reasoning from an earlier response, sent back (dropped: templates drop earlier turns' reasoning)."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Open):
    type: Literal["redacted_thinking"]


ContentBlock = Annotated[Union[TextBlock, DocumentBlock, SearchResultBlock, ToolUseBlock, ToolResultBlock,
                               ThinkingBlock, RedactedThinkingBlock, RefusedBlock], Field(discriminator="type")]


class InputMessage(_Model):
    role: Literal["user", "assistant", "system"] = Field(
        description="system: an instruction in place (as Claude Code sends them mid-conversation)")
    content: _text_or(ContentBlock) = Field(description=(
        "text, or blocks: tool_use only in assistant turns, tool_result, document and search_result only in user "
        "turns; a document (plain-text and content sources) or a search result is read as text; image, PDF and "
        "server-tool blocks are a 400 (the served model reads text only)"))


# ----- tools -----
class ToolParam(_Model):
    type: Literal["custom"] | None = Field(None, description="custom tools only: server tools are not served")
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    input_schema: dict[str, Any] = Field(description="JSON schema of the tool's input (an object)")
    strict: bool | None = None


class _ToolChoiceBase(_Model):
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAuto(_ToolChoiceBase):
    type: Literal["auto"]


class ToolChoiceAny(_ToolChoiceBase):
    type: Literal["any"]


class ToolChoiceTool(_ToolChoiceBase):
    type: Literal["tool"]
    name: str


class ToolChoiceNone(_Model):
    type: Literal["none"]


ToolChoice = Annotated[Union[ToolChoiceAuto, ToolChoiceAny, ToolChoiceTool, ToolChoiceNone],
                       Field(discriminator="type")]


# ----- thinking -----
class ThinkingEnabled(_Model):
    type: Literal["enabled"]
    budget_tokens: _int(THINKING_BUDGET_TOKENS, description="thinking ends after this many tokens")


class ThinkingDisabled(_Model):
    type: Literal["disabled"]


class ThinkingAdaptive(_Model):
    type: Literal["adaptive"] = Field(description="thinking on, with no budget")


Thinking = Annotated[Union[ThinkingEnabled, ThinkingDisabled, ThinkingAdaptive], Field(discriminator="type")]


class Metadata(_Model):
    user_id: str | None = None


# ----- structured output -----
class JsonOutputFormat(_Model):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema", description="the JSON schema the response's text follows")


class OutputConfig(_Model):
    format: JsonOutputFormat | None = Field(None, description="structured output: the text block is JSON that "
                                                              "follows the schema")
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        None, description="accepted; whether the model thinks is `thinking`'s to say")


# ----- bodies -----
class CountTokensBody(_Model):
    """POST /v1/messages/count_tokens: a request's prompt, counted as /v1/messages would render it."""

    model: str = Field(description="the served model name (GET /v1/models); any other is a 404",
                       json_schema_extra=_limit("model"))
    messages: Annotated[list[InputMessage], Field(min_length=1)] = Field(
        description="a final assistant turn with text is a prefill the response continues; its text may not end with "
                    "whitespace")
    system: _text_or(TextBlock) | None = None
    tools: Annotated[list[ToolParam], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None


class MessagesBody(CountTokensBody):
    """POST /v1/messages."""

    max_tokens: MaxCompletionTokens = Field(description="the most tokens to generate (required)")
    stop_sequences: Annotated[list[StopString], Field(json_schema_extra=_limit("stop_count"))] | None = None
    stream: bool | None = None
    metadata: Metadata | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    output_config: OutputConfig | None = None
    output_format: JsonOutputFormat | None = Field(None, description="the structured-outputs beta's name for "
                                                                     "output_config.format, which wins if both")

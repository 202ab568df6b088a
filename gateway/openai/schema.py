"""The request bodies of POST /v1/completions and POST /v1/chat/completions as typed models.

One definition serves both validation (gateway/openai/parse.py turns a validated body into the internal
request) and the OpenAPI document (gateway/openapi.py generates it from these models), so the two
cannot drift. Models are strict (a number is not a string, a boolean is not an integer) and forbid
unknown fields. Field constraints say what the server accepts, with the bounds shared/request_limits.py
defines (SamplingParams checks the same ones); what depends on the served model or the
server's flags (vocabulary size, context length, --max-n, stop-string limits) is marked with
`x-mili-limit` in the schema (filled in per server by gateway/openapi.py) and checked after validation,
as are the few rules between fields (gateway/openai/parse.py).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from gateway.text.reasoning_effort import EFFORTS
from shared.request_limits import (COMPLETION_MAX_TOKENS_DEFAULT, FREQUENCY_PENALTY, LOGIT_BIAS, LOGPROBS,
                                   MAX_BAD_WORD_CHARS, MAX_BAD_WORDS, MAX_COMPLETION_TOKENS, MAX_TOKENS, MAX_TOOLS,
                                   MIN_P, MIN_TOKENS, N, NAME_PATTERN,
                                   PRESENCE_PENALTY, PRIORITY, REPETITION_PENALTY, SEED, TEMPERATURE, TOKEN_ID,
                                   TOKEN_ID_KEY_PATTERN, TOP_K, TOP_P, TRUNCATE_PROMPT_TOKENS, Range)


def _limit(name: str) -> dict[str, Any]:
    """Marks a schema node for a bound the served model or the server's flags set (see gateway/openapi.py)."""
    return {"x-mili-limit": name}


def _integral(value: Any) -> Any:
    # JSON has one number type: 4.0 is the integer 4 (as JSON Schema's "integer" says); 4.5 stays a float and fails.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _int(bounds: Range, **field: Any) -> Any:
    """An integer field type with its bounds (shared/request_limits.py) and other Field arguments (Field first:
    after a validator, pydantic would write the bounds into the JSON schema as "ge"/"le" instead of
    minimum/maximum)."""
    return Annotated[int, Field(**bounds.field_kwargs(), **field), BeforeValidator(_integral)]


def _not_zero(value: int) -> int:
    if value == 0:
        raise ValueError("must be -1 (the context length) or positive")
    return value


# vLLM's truncate_prompt_tokens on generation: 0 would leave nothing to continue.
TruncatePrompt = Annotated[_int(TRUNCATE_PROMPT_TOKENS, json_schema_extra={**_limit("context"), "not": {"const": 0}}),
                           AfterValidator(_not_zero)]


def _float(bounds: Range) -> Any:
    """A number field type with its bounds (shared/request_limits.py)."""
    return Annotated[float, Field(**bounds.field_kwargs())]


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


# A token id: below the vocabulary size (checked against the served model after validation).
TokenId = _int(TOKEN_ID, json_schema_extra=_limit("token_id"))
TokenIds = Annotated[list[TokenId], Field(min_length=1, json_schema_extra=_limit("context"))]
# llama.cpp's one prompt of token ids with texts mixed in (gateway/text/mixed_prompt.py): its /completion, /infill
# and /embedding take it. A list of texts alone is no such prompt (a route refuses it, or reads several prompts).
MixedPrompt = Annotated[list[Union[TokenId, str]], Field(min_length=1, json_schema_extra={
    "contains": {"type": "integer"}, "description": "token ids, or token ids and texts mixed (at least one id)"})]
# JSON object keys are strings: logit_bias maps a token id written in decimal (TOKEN_ID_KEY_PATTERN) to a bias.
TokenIdKey = Annotated[str, Field(pattern=TOKEN_ID_KEY_PATTERN, json_schema_extra=_limit("token_id_key"))]
StopString = Annotated[str, Field(min_length=1, json_schema_extra=_limit("stop_length"))]
Stop = Union[StopString, Annotated[list[StopString], Field(json_schema_extra=_limit("stop_count"))]]
Logprobs = _int(LOGPROBS)
# The sampling fields both the chat-shaped endpoints and the Responses API take.
Temperature = _float(TEMPERATURE)
TopP = _float(TOP_P)
TopK = _int(TOP_K)
MinP = _float(MIN_P)
RepetitionPenalty = _float(REPETITION_PENALTY)
Seed = _int(SEED)
# The most tokens to generate (chat's max_completion_tokens and max_tokens, the Responses API's
# max_output_tokens): within the context, filled in per server.
MaxCompletionTokens = _int(MAX_COMPLETION_TOKENS, json_schema_extra=_limit("context"))
class OllamaBody(BaseModel):
    """Ollama's API's bodies (gateway/ollama/, and /api/embed in gateway/pooling/): unknown fields ignored, as
    Ollama's server ignores them (clients written for its newer or older versions keep working); types strict, as its
    own decoding is (a number sent as a string is a 400)."""

    model_config = ConfigDict(extra="ignore", strict=True)


# Ollama's spelling of the served model in those bodies: the name, or with Ollama's default tag (the enum
# gateway/openapi.py fills in).
OllamaModelName = Annotated[str, Field(min_length=1, json_schema_extra=_limit("ollama_model"))]
# OpenAI's prompt_cache_retention: accepted, no effect; the prefix cache keeps blocks while memory allows.
PromptCacheRetention = Literal["in_memory", "24h"]
PROMPT_CACHE_RETENTION = "accepted; cached prefixes stay while the KV cache has room for them"
# vLLM's request priority; a server scheduling first-come-first-served takes only 0 (gateway/openai/parse.py).
Priority = _int(PRIORITY, json_schema_extra=_limit("priority"))
PRIORITY_DESCRIPTION = ("lower runs first (default 0), with --scheduling-policy priority; "
                        "other values are a 400 on a first-come-first-served server")


class StreamOptions(_Model):
    include_usage: bool | None = None
    include_obfuscation: bool | None = Field(None, description="accepted; MILI's chunks are not padded")
    continuous_usage_stats: bool | None = Field(None, description="vLLM's: with include_usage, every chunk carries "
                                                                  "the usage so far")


JsonSchemaValue = Union[dict[str, Any], str]
Choices = Annotated[list[str], Field(min_length=1)]
_REGEX = "the whole output matches it (Rust regex syntax; \\d is [0-9])"
_GRAMMAR = "a Lark grammar (with a start rule) or a GBNF one (with root) the whole output follows"
_ONE = "; one output constraint per request"


class StructuredOutputs(_Model):
    """vLLM's structured_outputs: one of its fields."""

    json_: JsonSchemaValue | None = Field(None, alias="json", description="a JSON schema (or its JSON text)")
    regex: str | None = Field(None, description=_REGEX)
    choice: Choices | None = Field(None, description="the output is exactly one of these")
    grammar: str | None = Field(None, description=_GRAMMAR)
    json_object: bool | None = Field(None, description="true: any JSON object")


class CommonBody(_Model):
    """Fields both endpoints share: OpenAI's sampling fields, vLLM's extensions, and accepted no-ops."""

    model: str = Field(description="the served model name (GET /v1/models); any other is a 404",
                       json_schema_extra=_limit("model"))
    n: _int(N, json_schema_extra=_limit("n")) | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stop: Stop | None = None
    seed: Seed | None = None
    presence_penalty: _float(PRESENCE_PENALTY) | None = None
    frequency_penalty: _float(FREQUENCY_PENALTY) | None = None
    logit_bias: dict[TokenIdKey, _float(LOGIT_BIAS)] | None = None
    stream: bool | None = Field(None, description="true: the response is text/event-stream, ended by data: [DONE]")
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    # Extensions, as vLLM names them.
    top_k: TopK | None = Field(None, description="0 or -1: off")
    min_p: MinP | None = None
    repetition_penalty: RepetitionPenalty | None = None
    ignore_eos: bool | None = None
    min_tokens: _int(MIN_TOKENS) | None = Field(
        None, description="at most max_tokens")
    stop_token_ids: list[TokenId] | None = None
    skip_special_tokens: bool | None = Field(None, description="default true; false: special tokens the model "
                                                               "writes are in the text (not the one ending it)")
    include_stop_str_in_output: bool | None = Field(None, description="true: the text ends with the stop string "
                                                                      "that ended it")
    return_token_ids: bool | None = Field(None, description="true: the answer carries prompt_token_ids and each "
                                                            "choice (each chunk) its generated token_ids")
    truncate_prompt_tokens: TruncatePrompt | None = Field(
        None, description="keep the prompt's last N tokens (after the chat template); -1: the context length")
    allowed_token_ids: Annotated[list[TokenId], Field(min_length=1)] | None = Field(
        None, description="only these tokens may be sampled")
    bad_words: Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_BAD_WORD_CHARS)]],
                         Field(max_length=MAX_BAD_WORDS)] | None = Field(
        None, description="words the output never contains (as a word or after other text)")
    prompt_logprobs: Logprobs | None = Field(
        None, description="per prompt token (the first null): {token id: {logprob, rank, decoded_token}}; "
                          "not with stream")
    priority: Priority | None = Field(None, description=PRIORITY_DESCRIPTION)
    # Output constraints beyond response_format (gateway/text/output_constraints.py): vLLM's, then llama.cpp's.
    structured_outputs: StructuredOutputs | None = Field(None, description="vLLM's constraints" + _ONE)
    guided_json: JsonSchemaValue | None = Field(None, description="a JSON schema (or its JSON text)" + _ONE)
    guided_regex: str | None = Field(None, description=_REGEX + _ONE)
    guided_choice: Choices | None = Field(None, description="the output is exactly one of these" + _ONE)
    guided_grammar: str | None = Field(None, description=_GRAMMAR + _ONE)
    grammar: str | None = Field(None, description="llama.cpp's: " + _GRAMMAR + _ONE)
    json_schema: dict[str, Any] | None = Field(None, description="llama.cpp's: a JSON schema" + _ONE)
    # Accepted, no effect.
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    # OpenAI fields MILI does not implement: only the values that mean "not used" are accepted.
    best_of: Literal[1] | None = None
    functions: Annotated[list[Any], Field(max_length=0)] | None = None
    function_call: Literal["none"] | None = None
    audio: None = None
    prediction: None = None
    modalities: list[Literal["text"]] | None = None
    web_search_options: None = None
    reasoning_effort: None = None


def _when(field: str, value: dict, then: dict) -> dict[str, Any]:
    """A JSON-schema rule between fields: when `field` is present and matches `value`, the body matches `then`."""
    return {"if": {"required": [field], "properties": {field: value}}, "then": then}


def _needs(field: str, value: dict) -> dict[str, Any]:
    return {"required": [field], "properties": {field: value}}


# Rules between fields that both endpoints check after validation (gateway/openai/parse.py), stated in the schema:
# stream_options only with stream true, prompt_logprobs only without it. One if/then/else for both: every rule is a
# branch point for the generators that read the schema (schemathesis's expands them all, within a size budget the
# chat body comes near), and these two branch on the same field.
_COMMON_RULES = [{"if": _needs("stream", {"const": True}),
                  "then": {"properties": {"prompt_logprobs": {"type": "null"}}},
                  "else": {"properties": {"stream_options": {"type": "null"}}}}]

UNSUPPORTED = ("best_of", "functions", "function_call", "audio", "prediction", "modalities",
               "web_search_options", "reasoning_effort")
CHAT_UNSUPPORTED = (*(name for name in UNSUPPORTED if name != "reasoning_effort"), "verbosity", "moderation",
                    "prompt_cache_options")
ReasoningEffort = Literal[EFFORTS]


Prompt = Union[
    Annotated[str, Field(min_length=1)],
    Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)],
    TokenIds,
    Annotated[list[TokenIds], Field(min_length=1)],
]


_SUFFIX_GIVEN = {"type": "string", "minLength": 1}
_TEXT_PROMPT = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}


class CompletionBody(CommonBody):
    model_config = ConfigDict(json_schema_extra={"allOf": [
        *_COMMON_RULES, _when("max_tokens", {"const": 0}, _needs("echo", {"const": True})),
        _when("suffix", _SUFFIX_GIVEN, {"allOf": [_needs("prompt", _TEXT_PROMPT),
                                                  {"properties": {"echo": {"enum": [False, None]}}}]})]})

    prompt: Prompt = Field(description="text, texts, token ids, or arrays of token ids (one choice set each); "
                                       "a text must tokenize to at least one token")
    max_tokens: _int(MAX_TOKENS, json_schema_extra=_limit("context")) | None = Field(
        None, description=f"default {COMPLETION_MAX_TOKENS_DEFAULT}; 0 only with echo, to score the prompt; "
                          "prompt + max_tokens must fit the model's context")
    echo: bool | None = None
    logprobs: Logprobs | None = None
    suffix: str | None = Field(None, description="the text after the insertion point: the model writes what goes "
                                                 "between the prompt and it (fill-in-the-middle; text prompts, no "
                                                 "echo, and a model with fill-in-the-middle tokens, else a 400)")
    response_format: ResponseFormat | None = Field(None, description="vLLM's: the answer's JSON, as chat's" + _ONE)


# ----- chat -----

class TextPart(_Model):
    type: Literal["text"]
    text: str


Content = Union[str, list[TextPart]]


class FunctionCall(_Model):
    name: str
    arguments: str = Field(description="a JSON value, as text")

    @field_validator("arguments")
    @classmethod
    def _json(cls, value: str) -> str:
        try:
            json.loads(value)
        except ValueError:
            raise ValueError("is not valid JSON") from None
        return value


class ToolCall(_Model):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(_Model):
    role: Literal["system"]
    content: Content
    name: str | None = None


class DeveloperMessage(SystemMessage):
    """OpenAI's newer name for a system message: templates read it as one (gateway/openai/parse.py)."""

    role: Literal["developer"]  # its own schema, so that each role names one branch of the union


class UserMessage(_Model):
    role: Literal["user"]
    content: Content
    name: str | None = None


class AssistantMessage(_Model):
    role: Literal["assistant"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    # What clients send back with an assistant message taken from a response; none of it reaches the template.
    refusal: str | None = None
    reasoning_content: str | None = None
    function_call: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    annotations: list[Any] | None = None


class ToolMessage(_Model):
    role: Literal["tool"]
    content: Content
    tool_call_id: str = Field(description="the call this result answers")
    name: str | None = None


Message = Annotated[Union[SystemMessage, DeveloperMessage, UserMessage, AssistantMessage, ToolMessage],
                    Field(discriminator="role")]


class FunctionDefinition(_Model):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="JSON schema of the arguments")
    strict: bool | None = None


class Tool(_Model):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Model):
    name: str


class NamedToolChoice(_Model):
    type: Literal["function"]
    function: NamedFunction


class TextFormat(_Model):
    type: Literal["text"]


class JsonObjectFormat(_Model):
    type: Literal["json_object"]


class JsonSchemaSpec(_Model):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    schema_: dict[str, Any] = Field(None, alias="schema", description="a JSON schema; absent: any JSON value")
    strict: bool | None = None


class JsonSchemaFormat(_Model):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


class JsonObjectSchemaFormat(JsonObjectFormat):
    """Chat's json_object as llama.cpp and TGI also take it: an answer that validates against a schema."""

    schema_: dict[str, Any] | None = Field(None, alias="schema", description="llama.cpp's: the answer validates "
                                           "against this JSON schema, not strictly (as json_schema without strict)")
    value: dict[str, Any] | None = Field(None, description="TGI's name for schema, which the Hugging Face client "
                                         "sends; schema wins if both are sent")


ResponseFormat = Annotated[Union[TextFormat, JsonObjectSchemaFormat, JsonSchemaFormat], Field(discriminator="type")]


# vLLM's rule: the final message continued opens no new turn (the chat and tokenize bodies state it).
CONTINUE_NEEDS_NO_GENERATION_PROMPT = _when("continue_final_message", {"const": True},
                                            _needs("add_generation_prompt", {"const": False}))


class ChatBody(CommonBody):
    model_config = ConfigDict(json_schema_extra={"allOf": [
        *_COMMON_RULES, _when("top_logprobs", {"type": "integer"}, _needs("logprobs", {"const": True})),
        _when("tool_choice", {"anyOf": [{"const": "required"}, {"type": "object"}]},
              _needs("tools", {"type": "array", "minItems": 1})),
        CONTINUE_NEEDS_NO_GENERATION_PROMPT]})

    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: MaxCompletionTokens | None = Field(
        None, description="the rendered prompt + this must fit the model's context")
    max_tokens: MaxCompletionTokens | None = Field(
        None, description="the older name of max_completion_tokens")
    logprobs: bool | None = None
    top_logprobs: Logprobs | None = Field(None, description="only with logprobs: true")
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice] | None = Field(
        None, description="required needs tools; a named function must be one of tools")
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="passed to the chat template")
    add_generation_prompt: bool | None = Field(None, description="vLLM's: default true, the prompt ends by opening "
                                                                 "the assistant's turn")
    continue_final_message: bool | None = Field(
        None, description="vLLM's: the last message, an assistant's text, is continued rather than closed (a "
                          "prefill; with add_generation_prompt false)")
    reasoning_effort: ReasoningEffort | None = Field(
        None, description="none/minimal: thinking off, low/medium/high: on (the template's enable_thinking; "
                          "chat_template_kwargs win); a model without a thinking switch ignores it")
    # OpenAI's chat-only hints: accepted, no effect.
    safety_identifier: str | None = None
    prompt_cache_key: str | None = Field(None, description="accepted; the prefix cache needs no key")
    prompt_cache_retention: PromptCacheRetention | None = Field(None, description=PROMPT_CACHE_RETENTION)
    # Only the values that mean "not used": a model is not steered to a length by a flag, and nothing here
    # moderates or caches on request.
    verbosity: Literal["medium"] | None = Field(None, description="only the default is served")
    moderation: None = None
    prompt_cache_options: None = None

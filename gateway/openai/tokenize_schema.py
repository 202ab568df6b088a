"""The request bodies of POST /tokenize and POST /detokenize (vLLM's token-counting routes, and llama.cpp's
`content` body on /tokenize), as typed models: they validate and they make the OpenAPI document, as the OpenAI
endpoints' models do (gateway/openai/schema.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from gateway.openai.schema import CONTINUE_NEEDS_NO_GENERATION_PROMPT, Message, TokenId, Tool, _limit, _Model
from shared.request_limits import MAX_TOOLS

# The served name's enum goes on the string itself, so null (no model named) stays valid.
ServedName = Annotated[str, Field(json_schema_extra=_limit("model"))]
_MODEL = Field(None, description="the served model name; optional (any other is a 404)")
_STRS = Field(None, description="also each token's string in the vocabulary")


class TokenizePromptBody(_Model):
    model: ServedName | None = _MODEL
    prompt: str = Field(description="text, tokenized as /v1/completions tokenizes a prompt")
    add_special_tokens: bool | None = Field(None, description="default true (the tokenizer's BOS, if it adds one)")
    return_token_strs: bool | None = _STRS


class TokenizeChatBody(_Model):
    model_config = ConfigDict(json_schema_extra={"allOf": [CONTINUE_NEEDS_NO_GENERATION_PROMPT]})

    model: ServedName | None = _MODEL
    messages: Annotated[list[Message], Field(min_length=1)] = Field(
        description="a conversation, rendered by the chat template as /v1/chat/completions renders it")
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="passed to the chat template")
    add_generation_prompt: bool | None = Field(None, description="default true: end with the assistant's turn "
                                                                 "opened, as a chat request does")
    continue_final_message: bool | None = Field(
        None, description="as chat's: the last message, an assistant's text, left open (with add_generation_prompt "
                          "false)")
    return_token_strs: bool | None = _STRS


class DetokenizeBody(_Model):
    model: ServedName | None = _MODEL
    tokens: list[TokenId] = Field(description="token ids, decoded with special tokens kept")


class LlamaTokenizeBody(_Model):
    """llama.cpp server's /tokenize body, with its defaults."""

    content: str = Field(description="text, tokenized as it stands (special tokens' text is parsed as those tokens)")
    add_special: bool | None = Field(None, description="default false: llama.cpp's; true adds the tokenizer's BOS, "
                                                       "if it has one")
    with_pieces: bool | None = Field(None, description="default false; true answers each token as {id, piece}: "
                                                       "its text, or its bytes where they are not whole UTF-8")
    parse_special: Literal[True] | None = Field(None, description="true (llama.cpp's default): special tokens' text "
                                                                 "is parsed as those tokens; false is not served")

"""The request body of text-generation-inference's (TGI's) POST /generate, /generate_stream and / (where `stream`
picks which), as typed models. TGI's own bounds where they are stricter than MILI's (temperature and top_p open at
0, top_k positive, at most 5 top tokens), MILI's where its sampler has them (shared/request_limits.py). Unknown
fields are ignored, as TGI ignores them; types are strict, as its decoding is. The fields MILI does not serve
(typical_p, watermark, best_of beyond 1, adapter_id) are accepted only unset."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

from gateway.huggingface.body import FalseOnly, HfBody
from gateway.openai.schema import (JsonSchemaValue, MaxCompletionTokens, RepetitionPenalty, Seed, StopString, _float,
                                   _int, _limit)
from shared.request_limits import COUNT_MAX, FREQUENCY_PENALTY, Range

TOP_N_TOKENS = Range(0, 5)  # TGI's default --max-top-n-tokens
# TGI's fields MILI accepts only with the value that means "not used" (a 422 naming the field otherwise).
UNSERVED = ("typical_p", "watermark", "best_of", "adapter_id")


class JsonGrammar(HfBody):
    type: Literal["json", "json_object"]
    value: JsonSchemaValue = Field(description="a JSON schema, or a string holding one")


class SchemaName(HfBody):
    name: str | None = None
    schema_: dict = Field(alias="schema")


class JsonSchemaGrammar(HfBody):
    type: Literal["json_schema"]
    value: SchemaName


class RegexGrammar(HfBody):
    type: Literal["regex"]
    value: str = Field(description="the whole answer matches it (Rust regex syntax; \\d is [0-9])")


TgiGrammar = Annotated[Union[JsonGrammar, JsonSchemaGrammar, RegexGrammar], Field(discriminator="type")]


class TgiParameters(HfBody):
    max_new_tokens: MaxCompletionTokens | None = Field(
        None, description="the most tokens to generate; none: up to 1024, within the context")
    do_sample: bool = False
    temperature: Annotated[float, Field(gt=0, le=2)] | None = None
    top_k: _int(Range(1, COUNT_MAX)) | None = None
    top_p: Annotated[float, Field(gt=0, lt=1)] | None = None
    repetition_penalty: RepetitionPenalty | None = None
    frequency_penalty: _float(FREQUENCY_PENALTY) | None = None
    stop: Annotated[list[StopString], Field(json_schema_extra=_limit("stop_count"))] = Field(default_factory=list)
    seed: Seed | None = None
    return_full_text: bool | None = Field(None, description="the prompt before the generated text (default: false; "
                                                            "on POST /, true, as TGI's)")
    details: bool = False
    decoder_input_details: bool = Field(False, description="the prompt's tokens and logprobs in details.prefill "
                                                           "(not when streaming: a 422)")
    top_n_tokens: _int(TOP_N_TOKENS) | None = None
    truncate: _int(Range(1, COUNT_MAX), json_schema_extra=_limit("context")) | None = Field(
        None, description="keep the prompt's last N tokens")
    grammar: TgiGrammar | None = None
    typical_p: None = Field(None, description="not supported")
    watermark: FalseOnly = Field(False, description="not supported")
    best_of: _int(Range(1, 1)) | None = Field(None, description="not supported beyond 1")
    adapter_id: None = Field(None, description="not supported: no adapters are loaded")


class TgiGenerateBody(HfBody):
    inputs: Annotated[str, Field(min_length=1)]
    parameters: TgiParameters | None = None
    stream: bool = Field(False, description="POST / only: answer as /generate_stream does")

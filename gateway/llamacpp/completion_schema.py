"""The request body of llama.cpp server's own POST /completion, as a typed model. Types are strict; bounds are the
completion checks' (shared/request_limits.py: the request runs as the completion it means,
gateway/llamacpp/to_completion.py), so that the OpenAPI document (gateway/openapi.py) states them. Unknown fields are
ignored, as llama.cpp ignores them (cache_prompt, id_slot, n_keep, samplers, t_max_prompt_ms and the like change
nothing MILI does: its prefix cache is always on). llama.cpp's samplers that MILI does not have are accepted only at
the value that turns them off (SAMPLERS_OFF), a 400 naming the field otherwise."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from gateway.openai.schema import (Logprobs, MinP, MixedPrompt, RepetitionPenalty, Seed, StopString, TopK, TopP,
                                   _float, _int, _limit)
from shared.request_limits import (COUNT_MAX, FREQUENCY_PENALTY, LOGIT_BIAS, PRESENCE_PENALTY, TEMPERATURE, TOKEN_ID,
                                   TOKEN_ID_KEY_PATTERN, Range)

# llama.cpp's sampling defaults (common/common.h), which apply to a request that does not set them.
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
# llama.cpp samplers MILI does not run, with the value that turns each off.
SAMPLERS_OFF = {"typical_p": 1.0, "mirostat": 0, "dry_multiplier": 0.0, "xtc_probability": 0.0,
                "top_n_sigma": -1.0, "dynatemp_range": 0.0}

# A token id written as text: a decimal number without leading zeros (any other text is tokenized).
TOKEN_ID_TEXT = r"^(0|[1-9][0-9]*)$"


def token_text_choices(id_pattern: str) -> list[dict[str, Any]]:
    """A token given by its id or its text: a text that is a token id (TOKEN_ID_TEXT) must match `id_pattern`
    (ids below the vocabulary size; the `token_text` limit fills in the served one), any other text is tokenized."""
    return [{"pattern": id_pattern}, {"not": {"pattern": TOKEN_ID_TEXT}}]


_TOKEN_TEXT = {"type": "string", "anyOf": token_text_choices(TOKEN_ID_KEY_PATTERN), **_limit("token_text")}
_TOKEN = {"anyOf": [{"type": "integer", "minimum": TOKEN_ID.lo, "maximum": TOKEN_ID.hi, **_limit("token_id")},
                    _TOKEN_TEXT]}
_BIAS = {"anyOf": [{"type": "number", "minimum": LOGIT_BIAS.lo, "maximum": LOGIT_BIAS.hi},
                   {"const": False, "description": "never this token"}]}
# logit_bias: [[token id or text, bias or false], ...] or {"token id or text": bias or false}. The checks are the
# translation's (gateway/llamacpp/to_completion.py) and the completion's.
BiasPair = Annotated[list[Union[_int(Range()), str, float, bool]], Field(min_length=2, max_length=2),
                     WithJsonSchema({"type": "array", "prefixItems": [_TOKEN, _BIAS], "items": False,
                                     "minItems": 2})]
LogitBias = Union[list[BiasPair],
                  Annotated[dict[str, Union[float, bool]],
                            WithJsonSchema({"type": "object", "propertyNames": _TOKEN_TEXT,
                                            "additionalProperties": _BIAS})]]


def _not_zero(value: int) -> int:
    if value == 0:
        raise ValueError("must be -1 (until the end of the context) or at least 1")
    return value


NPredict = Annotated[_int(Range(-1, COUNT_MAX), json_schema_extra={**_limit("context"), "not": {"const": 0}}),
                     AfterValidator(_not_zero)]


def _off(name: str) -> Any:
    """A sampler MILI does not run: only the value that turns it off (checked by the translation, with a 400
    naming the field)."""
    value = SAMPLERS_OFF[name]
    kind = _int(Range()) if isinstance(value, int) else float
    return Annotated[kind, Field(json_schema_extra={"const": value})]


class LlamaBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class LlamaCompletionBody(LlamaBody):
    prompt: Union[str, MixedPrompt] = Field(
        description="the text, its token ids, or token ids and texts mixed (one prompt, as llama-server reads them)")
    n_predict: NPredict = Field(-1, description="the most tokens to generate, which the prompt must leave room for "
                                                "in the context; -1: until the end of the context")
    temperature: Annotated[float, Field(le=TEMPERATURE.hi)] | None = Field(
        None, description="default 0.8; 0 or below: greedy")
    top_k: TopK | None = Field(None, description="default 40; 0 or -1: off")
    top_p: TopP | None = Field(None, description="default 0.95; 1: off")
    min_p: MinP | None = Field(None, description="default 0.05; 0: off")
    stop: Annotated[list[StopString], Field(json_schema_extra=_limit("stop_count"))] = Field(
        default_factory=list, description="strings that end the text (not included in it)")
    stream: bool = False
    seed: Seed = Field(-1, description="-1: a random one")
    n_probs: Logprobs = Field(0, description="with each token, its probability and that many alternatives")
    grammar: str | None = Field(None, description="a GBNF grammar the text follows (empty: none); one output "
                                                  "constraint per request")
    json_schema: dict[str, Any] | None = Field(None, description="a JSON schema the text follows; one output "
                                                                 "constraint per request")
    ignore_eos: bool = False
    logit_bias: LogitBias | None = None
    repeat_penalty: RepetitionPenalty = Field(1.0, description="1: off; counts every token of the prompt and the "
                                                               "output")
    repeat_last_n: _int(Range()) = Field(64, description="accepted; the penalties count the whole sequence")
    presence_penalty: _float(PRESENCE_PENALTY) = 0.0
    frequency_penalty: _float(FREQUENCY_PENALTY) = 0.0
    return_tokens: bool = Field(False, description="the generated token ids in `tokens`")
    n_indent: _int(Range()) = Field(0, description="code completion: end the text before a line, after the first, "
                                                   "indented by fewer spaces or tabs than this (0 or below: off)")
    t_max_predict_ms: _int(Range()) = Field(0, description="code completion: once the text has a newline, end it "
                                                           "this many milliseconds after its first token (0 or "
                                                           "below: off)")
    response_fields: list[str] = Field(default_factory=list, description="only these fields of the final answer; a "
                                       "nested one by its path (\"timings/prompt_n\"), returned under that name")
    typical_p: _off("typical_p") = SAMPLERS_OFF["typical_p"]
    mirostat: _off("mirostat") = SAMPLERS_OFF["mirostat"]
    dry_multiplier: _off("dry_multiplier") = SAMPLERS_OFF["dry_multiplier"]
    xtc_probability: _off("xtc_probability") = SAMPLERS_OFF["xtc_probability"]
    top_n_sigma: _off("top_n_sigma") = SAMPLERS_OFF["top_n_sigma"]
    dynatemp_range: _off("dynatemp_range") = SAMPLERS_OFF["dynatemp_range"]


class InfillChunk(LlamaBody):
    text: str = Field(description="another file's text, put ahead of the one being edited")
    filename: str = Field("tmp", description="its name, after the file separator")


class LlamaInfillBody(LlamaCompletionBody):
    """POST /infill: /completion's fields, with the code around the cursor in place of the prompt."""
    input_prefix: str = Field(description="the text before the cursor")
    input_suffix: str = Field(description="the text after the cursor")
    input_extra: list[InfillChunk] = Field(default_factory=list, description="other files, as context")
    prompt: str = Field("", description="text after the prefix, where the completion continues from")

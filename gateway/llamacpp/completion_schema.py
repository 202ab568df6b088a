"""The request body of llama.cpp server's own POST /completion, as a typed model. Types are strict; bounds are the
completion checks' (the request runs as the completion it means, gateway/llamacpp/to_completion.py). Unknown
fields are ignored, as llama.cpp ignores them (cache_prompt, id_slot, n_keep, samplers, t_max_prompt_ms and
the like change nothing MILI does: its prefix cache is always on). llama.cpp's samplers that MILI does not have
are accepted only at the value that turns them off (SAMPLERS_OFF), a 400 naming the field otherwise."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Field

# llama.cpp's sampling defaults (common/common.h), which apply to a request that does not set them.
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
# llama.cpp samplers MILI does not run, with the value that turns each off.
SAMPLERS_OFF = {"typical_p": 1.0, "mirostat": 0, "dry_multiplier": 0.0, "xtc_probability": 0.0,
                "top_n_sigma": -1.0, "dynatemp_range": 0.0}

# logit_bias: [[token id or text, bias or false], ...] or {"token id or text": bias or false}
Bias = Union[float, bool]
LogitBias = Union[list[Annotated[list[Union[int, str, float, bool]], Field(min_length=2, max_length=2)]],
                  dict[str, Bias]]


class LlamaBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class LlamaCompletionBody(LlamaBody):
    prompt: Union[str, Annotated[list[Union[int, str]], Field(min_length=1)]] = Field(
        description="the text, its token ids, or token ids and texts mixed (one prompt, as llama-server reads them)")
    n_predict: int = Field(-1, description="the most tokens to generate; -1: until the end of the context")
    temperature: float | None = Field(None, description="default 0.8; 0 or below: greedy")
    top_k: int | None = Field(None, description="default 40; 0: off")
    top_p: float | None = Field(None, description="default 0.95; 1: off")
    min_p: float | None = Field(None, description="default 0.05; 0: off")
    stop: list[str] = Field(default_factory=list, description="strings that end the text (not included in it)")
    stream: bool = False
    seed: int = Field(-1, description="-1: a random one")
    n_probs: int = Field(0, description="with each token, its probability and that many alternatives")
    grammar: str | None = Field(None, description="a GBNF grammar the text follows")
    json_schema: dict[str, Any] | None = Field(None, description="a JSON schema the text follows")
    ignore_eos: bool = False
    logit_bias: LogitBias | None = None
    repeat_penalty: float = Field(1.0, description="1: off; counts every token of the prompt and the output")
    repeat_last_n: int = Field(64, description="accepted; the penalties count the whole sequence")
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    return_tokens: bool = Field(False, description="the generated token ids in `tokens`")
    n_indent: int = Field(0, description="code completion: end the text before a line, after the first, indented by "
                                         "fewer spaces or tabs than this (0: off)")
    t_max_predict_ms: int = Field(0, description="code completion: once the text has a newline, end it this many "
                                                 "milliseconds after its first token (0: off)")
    response_fields: list[str] = Field(default_factory=list, description="only these fields of the final answer; a "
                                       "nested one by its path (\"timings/prompt_n\"), returned under that name")
    typical_p: float = 1.0
    mirostat: int = 0
    dry_multiplier: float = 0.0
    xtc_probability: float = 0.0
    top_n_sigma: float = -1.0
    dynatemp_range: float = 0.0


class InfillChunk(LlamaBody):
    text: str = Field(description="another file's text, put ahead of the one being edited")
    filename: str = Field("tmp", description="its name, after the file separator")


class LlamaInfillBody(LlamaCompletionBody):
    """POST /infill: /completion's fields, with the code around the cursor in place of the prompt."""
    input_prefix: str = Field(description="the text before the cursor")
    input_suffix: str = Field(description="the text after the cursor")
    input_extra: list[InfillChunk] = Field(default_factory=list, description="other files, as context")
    prompt: str = Field("", description="text after the prefix, where the completion continues from")

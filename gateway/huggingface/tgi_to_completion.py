"""A TGI generate request as the Completions request it means, so that it gets every check, grammar and path to the
worker a completion gets:
- sampling: TGI samples with `do_sample`, or when any of temperature (other than 1), top_k or top_p is set (its
  warpers turn sampling on), and when the body has no `parameters` at all; otherwise it is greedy (temperature 0);
- stop strings stay in the text, as TGI keeps them (vLLM's include_stop_str_in_output);
- every token's logprob is computed (TGI sends one with each token), with `top_n_tokens` alternatives;
- `decoder_input_details` scores the prompt (prompt_logprobs), `truncate` keeps its last N tokens;
- `grammar` is a structured output: json / json_object / json_schema a JSON schema, regex a regular expression.
A 422 from those checks names the TGI field (`parameters.max_new_tokens`), not the completion field.
"""

from __future__ import annotations

import contextlib
from typing import Any

from gateway.huggingface.tgi_schema import (JsonGrammar, JsonSchemaGrammar, RegexGrammar, TgiGenerateBody,
                                            TgiParameters)
from gateway.server.errors import invalid, params_renamed

# TGI's default when max_new_tokens is not given: up to this many, within the context.
DEFAULT_MAX_NEW_TOKENS = 1024

_RENAMED = {"max_tokens": "max_new_tokens", "logprobs": "top_n_tokens", "prompt_logprobs": "decoder_input_details",
            "truncate_prompt_tokens": "truncate", "prompt": "inputs"}


def parameters_of(body: TgiGenerateBody) -> TgiParameters:
    """The body's parameters; a body without any samples (TGI's default_parameters has do_sample true)."""
    return body.parameters if body.parameters is not None else TgiParameters(do_sample=True)


def samples(p: TgiParameters) -> bool:
    return p.do_sample or (p.temperature is not None and p.temperature != 1.0) or p.top_k is not None or \
        p.top_p is not None


def completion_body(body: TgiGenerateBody, model: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    p = parameters_of(body)
    if stream and p.decoder_input_details:  # as TGI: the prompt's details have no place in a stream
        raise invalid("parameters.decoder_input_details == true is not supported when streaming tokens",
                      "parameters.decoder_input_details")
    request: dict[str, Any] = {"model": model, "prompt": body.inputs, "max_tokens": max_tokens, "stream": stream,
                               "logprobs": p.top_n_tokens or 0, "include_stop_str_in_output": True}
    if samples(p):
        request["temperature"] = 1.0 if p.temperature is None else p.temperature
        for name in ("top_k", "top_p", "seed"):
            if getattr(p, name) is not None:
                request[name] = getattr(p, name)
    else:
        request["temperature"] = 0.0
    for name in ("repetition_penalty", "frequency_penalty"):
        if getattr(p, name) is not None:
            request[name] = getattr(p, name)
    if p.stop:
        request["stop"] = p.stop
    if p.decoder_input_details:
        request["prompt_logprobs"] = 0
    if p.truncate is not None:
        request["truncate_prompt_tokens"] = p.truncate
    if p.grammar is not None:
        request["structured_outputs"] = _structured(p.grammar)
    return request


def _structured(grammar: JsonGrammar | JsonSchemaGrammar | RegexGrammar) -> dict[str, Any]:
    if isinstance(grammar, RegexGrammar):
        return {"regex": grammar.value}
    if isinstance(grammar, JsonSchemaGrammar):
        return {"json": grammar.value.schema_}
    return {"json": grammar.value}  # a schema, or its JSON text (the completion's checks read either)


def tgi_names() -> contextlib.AbstractContextManager[None]:
    """A 400 from the completion checks, naming the TGI field."""
    return params_renamed(_tgi_param)


def _tgi_param(param: str) -> str:
    if param.startswith("parameters."):
        return param
    head, sep, rest = param.partition(".")
    if head == "structured_outputs":  # the grammar's value became structured_outputs.json or .regex
        return "parameters.grammar.value"
    name = _RENAMED.get(head, head)
    return name + sep + rest if name == "inputs" else f"parameters.{name}{sep}{rest}"

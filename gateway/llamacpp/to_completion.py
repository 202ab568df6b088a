"""A llama.cpp /completion request as the Completions request it means, so that it gets every check, grammar and
path to the worker a completion gets:
- sampling: llama.cpp's defaults where the body sets nothing (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05);
  a temperature of 0 or below is greedy;
- n_predict -1 runs to the end of the context (the route parses the completion with no max_tokens default);
  seed -1 is a random seed;
- n_probs asks for each token's logprob and that many alternatives;
- grammar (GBNF; an empty one is none) and json_schema are the completion's llama.cpp-named constraints;
- logit_bias in either of llama.cpp's forms, a token given by its id, by its id written as text (no leading zeros),
  or by its text biasing each of its tokens, and `false` meaning never (the lowest bias);
- repeat_penalty is the completion's repetition_penalty.
A 400 from those checks names the llama.cpp field (`n_predict`), not the completion field.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Callable

from gateway.llamacpp.completion_schema import DEFAULTS, SAMPLERS_OFF, TOKEN_ID_TEXT, LlamaCompletionBody
from gateway.server.errors import invalid, params_renamed
from gateway.text.mixed_prompt import mixed_prompt_ids
from shared.request_limits import LOGIT_BIAS

_RENAMED = {"max_tokens": "n_predict", "logprobs": "n_probs", "repetition_penalty": "repeat_penalty"}


def completion_body(body: LlamaCompletionBody, model: str,
                    tokenize: Callable[[str, bool], list[int]]) -> dict[str, Any]:
    """`tokenize(text, add_special)`: a text's token ids, with the tokenizer's special tokens around it or without
    (logit_bias given as text; the texts of a mixed prompt)."""
    for name, off in SAMPLERS_OFF.items():
        if getattr(body, name) != off:
            raise invalid(f"{name} is not supported by this server (only {off}, which turns it off)", name)
    request: dict[str, Any] = {"model": model, "prompt": _prompt(body.prompt, tokenize), "stream": body.stream}
    temperature = DEFAULTS["temperature"] if body.temperature is None else body.temperature
    if temperature <= 0:
        request["temperature"] = 0.0
    else:
        request["temperature"] = temperature
        for name in ("top_k", "top_p", "min_p"):
            value = getattr(body, name)
            request[name] = DEFAULTS[name] if value is None else value
        if body.seed != -1:
            request["seed"] = body.seed
    if body.n_predict != -1:
        request["max_tokens"] = body.n_predict
    if body.stop:
        request["stop"] = body.stop
    if body.n_probs:
        request["logprobs"] = body.n_probs
    if body.grammar:  # an empty grammar is none, as llama-server reads it (its web UI sends "")
        request["grammar"] = body.grammar
    if body.json_schema is not None:
        request["json_schema"] = body.json_schema
    if body.ignore_eos:
        request["ignore_eos"] = True
    if body.logit_bias:
        request["logit_bias"] = _logit_bias(body.logit_bias, lambda text: tokenize(text, False))
    if body.repeat_penalty != 1.0:
        request["repetition_penalty"] = body.repeat_penalty
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name) != 0.0:
            request[name] = getattr(body, name)
    return {k: v for k, v in request.items() if v is not None}


def _prompt(prompt: str | list[int | str], tokenize: Callable[[str, bool], list[int]]) -> str | list[int]:
    """The text or token ids; token ids and texts mixed become token ids as llama-server makes them
    (gateway/text/mixed_prompt.py). A list of texts alone is llama-server's several prompts, which MILI does not
    serve."""
    if isinstance(prompt, str) or all(isinstance(p, int) for p in prompt):
        return prompt
    if all(isinstance(p, str) for p in prompt):
        raise invalid("one prompt per request: a list of texts is several prompts to llama-server, which this "
                      "server does not run in one request; send each alone (token ids and texts mixed are one prompt)",
                      "prompt")
    return mixed_prompt_ids(prompt, tokenize)  # never empty: the list holds an id


def _logit_bias(given: list | dict, encode: Callable[[str], list[int]]) -> dict[str, float]:
    pairs = given.items() if isinstance(given, dict) else [tuple(pair) for pair in given]
    out: dict[str, float] = {}
    for token, bias in pairs:
        if isinstance(bias, bool):
            if bias:
                raise invalid("a logit_bias of true means nothing: give a number, or false to ban the token",
                              "logit_bias")
            bias = float(LOGIT_BIAS.lo)
        elif not isinstance(bias, (int, float)):
            raise invalid("each logit_bias entry is [token, bias]: a bias is a number or false", "logit_bias")
        if isinstance(token, bool) or isinstance(token, float):
            raise invalid("each logit_bias entry is [token, bias]: a token is an id or a text", "logit_bias")
        ids = [token] if isinstance(token, int) else [int(token)] if re.match(TOKEN_ID_TEXT, token) else encode(token)
        for token_id in ids:
            out[str(token_id)] = float(bias)
    return out


def llama_names() -> contextlib.AbstractContextManager[None]:
    """A 400 from the completion checks, naming the llama.cpp field."""
    return params_renamed(_llama_param)


def _llama_param(param: str) -> str:
    head, sep, rest = param.partition(".")
    return _RENAMED.get(head, head) + sep + rest

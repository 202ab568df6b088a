"""Each request limit is defined once (shared/request_limits.py), and the request models, the OpenAPI document
generated from them and SamplingParams' own checks all keep it: at both edges of every range, a value just
inside is accepted by each of them and a value just outside is refused by each of them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema
import pytest

from gateway.openai.parse import Limits, parse_chat, parse_completion
from gateway.openai.schema import UNSUPPORTED as OPENAI_UNSUPPORTED
from gateway.openai.schema import ChatBody, CompletionBody
from gateway.openai.tokenize_schema import DetokenizeBody, TokenizeChatBody
from gateway.openai.validation import validate
from gateway.openapi import ServedBounds, document
from gateway.responses_api.schema import UNSUPPORTED as RESPONSES_UNSUPPORTED
from gateway.responses_api.schema import ResponsesBody
from gateway.server.errors import ApiError
from gateway.text import grammars
from shared import request_limits as rl
from shared.request_limits import Range
from shared.sampling_params import SamplingParams, SamplingParamsError

M = "m"
MODELS = {"CompletionBody": CompletionBody, "ChatBody": ChatBody, "ResponsesBody": ResponsesBody,
          "DetokenizeBody": DetokenizeBody}
BASE = {"CompletionBody": {"model": M, "prompt": "x"},
        "ChatBody": {"model": M, "messages": [{"role": "user", "content": "x"}]},
        "ResponsesBody": {"model": M, "input": "x"}, "DetokenizeBody": {"model": M}}
_BOUND_KEYS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


@dataclass(frozen=True)
class Limit:
    name: str
    rng: Range
    integer: bool
    # (component, the field, the path from the field's non-null schema to the bounded node, the body's value)
    fields: tuple[tuple[str, str, tuple[str, ...], Callable[[Any], Any]], ...]
    params: Callable[[Any], dict[str, Any]] | None  # SamplingParams' arguments; None: not a sampling parameter


# What a field needs beside it, by the rules between fields (a completion's max_tokens 0 only with echo).
NEEDS = {("CompletionBody", "max_tokens"): {"echo": True}, ("ChatBody", "top_logprobs"): {"logprobs": True}}


def _plain(v: Any) -> Any:
    return v


def _each(field: str, *components: str, path: tuple[str, ...] = (), wrap: Callable[[Any], Any] = _plain):
    return tuple((c, field, path, wrap) for c in components)


ALL3 = ("CompletionBody", "ChatBody", "ResponsesBody")
LIMITS = [
    Limit("temperature", rl.TEMPERATURE, False, _each("temperature", *ALL3), lambda v: {"temperature": v}),
    Limit("top_p", rl.TOP_P, False, _each("top_p", *ALL3), lambda v: {"top_p": v}),
    Limit("top_k", rl.TOP_K, True, _each("top_k", *ALL3), lambda v: {"top_k": v}),
    Limit("min_p", rl.MIN_P, False, _each("min_p", *ALL3), lambda v: {"min_p": v}),
    Limit("presence_penalty", rl.PRESENCE_PENALTY, False, _each("presence_penalty", "CompletionBody", "ChatBody"),
          lambda v: {"presence_penalty": v}),
    Limit("frequency_penalty", rl.FREQUENCY_PENALTY, False, _each("frequency_penalty", "CompletionBody", "ChatBody"),
          lambda v: {"frequency_penalty": v}),
    Limit("repetition_penalty", rl.REPETITION_PENALTY, False, _each("repetition_penalty", *ALL3),
          lambda v: {"repetition_penalty": v}),
    Limit("logit_bias values", rl.LOGIT_BIAS, False,
          _each("logit_bias", "CompletionBody", "ChatBody", path=("patternProperties", rl.TOKEN_ID_KEY_PATTERN), wrap=lambda v: {"5": v}),
          lambda v: {"logit_bias": {5: v}}),
    Limit("seed", rl.SEED, True, _each("seed", *ALL3), lambda v: {"seed": v}),
    Limit("n", rl.N, True, _each("n", "CompletionBody", "ChatBody"), lambda v: {"n": v}),
    Limit("min_tokens", rl.MIN_TOKENS, True, _each("min_tokens", "CompletionBody", "ChatBody"),
          lambda v: {"min_tokens": v}),
    Limit("max_tokens", rl.MAX_TOKENS, True, _each("max_tokens", "CompletionBody"), lambda v: {"max_tokens": v}),
    Limit("max_completion_tokens", rl.MAX_COMPLETION_TOKENS, True,
          _each("max_completion_tokens", "ChatBody") + _each("max_tokens", "ChatBody")
          + _each("max_output_tokens", "ResponsesBody"), None),
    Limit("logprobs", rl.LOGPROBS, True, _each("logprobs", "CompletionBody"), lambda v: {"logprobs": v}),
    Limit("top_logprobs", rl.LOGPROBS, True, _each("top_logprobs", "ChatBody", "ResponsesBody"),
          lambda v: {"logprobs": v}),
    Limit("prompt_logprobs", rl.LOGPROBS, True, _each("prompt_logprobs", "CompletionBody", "ChatBody"),
          lambda v: {"prompt_logprobs": v}),
    Limit("stop_token_ids", rl.TOKEN_ID, True,
          _each("stop_token_ids", "CompletionBody", "ChatBody", path=("items",), wrap=lambda v: [v]),
          lambda v: {"stop_token_ids": (v,)}),
    Limit("prompt token ids", rl.TOKEN_ID, True,
          (("CompletionBody", "prompt", ("items",), lambda v: [v]),
           ("DetokenizeBody", "tokens", ("items",), lambda v: [v])), None),
]


def _edges(rng: Range, integer: bool) -> list[tuple[Any, bool]]:
    """(value, inside): each finite edge, and the value next to it on its other side."""
    def value(x: Any) -> Any:
        return x if integer else float(x)

    def step(x: Any, up: bool) -> Any:
        return x + (1 if up else -1) if integer else math.nextafter(x, math.inf if up else -math.inf)

    out = []
    if rng.lo is not None:
        lo = value(rng.lo)
        out += [(lo, False), (step(lo, up=True), True)] if rng.lo_open else [(lo, True), (step(lo, up=False), False)]
    if rng.hi is not None:
        hi = value(rng.hi)
        out += [(hi, False), (step(hi, up=False), True)] if rng.hi_open else [(hi, True), (step(hi, up=True), False)]
    return out


def test_edges_helper():
    assert _edges(Range(0, 2), False) == [(0.0, True), (-5e-324, False), (2.0, True), (math.nextafter(2.0, 3), False)]
    assert _edges(Range(0, 1, lo_open=True), False) == [(0.0, False), (5e-324, True), (1.0, True),
                                                       (math.nextafter(1.0, 2), False)]
    assert _edges(Range(1), True) == [(1, True), (0, False)]


CASES = [(limit, value, inside) for limit in LIMITS for value, inside in _edges(limit.rng, limit.integer)]


@pytest.fixture(scope="module")
def doc() -> dict:
    # No served model yet: the static bounds stay as defined; --max-n at its widest.
    return document(ServedBounds((M,), Limits(max_n=rl.N.hi)))


def _node(doc: dict, component: str, field: str, path: tuple[str, ...]) -> dict:
    node = doc["components"]["schemas"][component]["properties"][field]
    if "anyOf" in node:  # the field or null; a prompt's shapes: token ids are the third
        node = node["anyOf"][2 if field == "prompt" else 0]
    for key in path:
        node = node[key]
    return node


@pytest.mark.parametrize("limit", LIMITS, ids=[limit.name for limit in LIMITS])
def test_the_document_states_the_defined_bounds(doc, limit):
    wanted = {_BOUND_KEYS[k]: v for k, v in limit.rng.field_kwargs().items()}
    for component, field, path, _ in limit.fields:
        node = _node(doc, component, field, path)
        assert {k: node[k] for k in _BOUND_KEYS.values() if k in node} == wanted, (component, field)
        assert node["type"] == ("integer" if limit.integer else "number"), (component, field)


@pytest.mark.parametrize("limit, value, inside", CASES,
                         ids=[f"{limit.name}={value!r}" for limit, value, _ in CASES])
def test_every_check_agrees_at_the_edges(doc, limit, value, inside):
    assert limit.rng.contains(value) is inside
    for component, field, _, wrap in limit.fields:
        body = {**BASE[component], **NEEDS.get((component, field), {}), field: wrap(value)}
        schema = {"$ref": f"#/components/schemas/{component}", "components": doc["components"]}
        assert jsonschema.Draft202012Validator(schema).is_valid(body) is inside, (component, field, "document")
        unsupported = RESPONSES_UNSUPPORTED if component == "ResponsesBody" else OPENAI_UNSUPPORTED
        try:
            validate(MODELS[component], body, unsupported)
            accepted = True
        except ApiError as e:
            accepted = False
            assert e.status == 400 and e.param == field, (e.param, e.message)
        assert accepted is inside, (component, field, "request model")
    if limit.params is not None:
        try:
            SamplingParams(**limit.params(value))
            accepted = True
        except SamplingParamsError:
            accepted = False
        assert accepted is inside, "SamplingParams"


@pytest.mark.parametrize("key, inside", [("0", True), (str(rl.TOKEN_ID.hi), True), (str(rl.TOKEN_ID.hi + 1), False),
                                         ("-1", False), ("01", False)])
def test_logit_bias_keys_are_token_ids(doc, key, inside):
    body = {**BASE["CompletionBody"], "logit_bias": {key: 1.0}}
    schema = {"$ref": "#/components/schemas/CompletionBody", "components": doc["components"]}
    assert jsonschema.Draft202012Validator(schema).is_valid(body) is inside
    try:
        validate(CompletionBody, body)
        accepted = True
    except ApiError as e:
        accepted = False
        assert e.param == "logit_bias"
    assert accepted is inside
    if key != "01":
        try:
            SamplingParams(logit_bias={int(key): 1.0})
            accepted = True
        except SamplingParamsError:
            accepted = False
        assert accepted is inside


def test_max_n_stays_within_n():
    assert Limits().max_n == rl.DEFAULT_MAX_N and rl.N.contains(rl.DEFAULT_MAX_N)
    Limits(max_n=rl.N.lo)
    Limits(max_n=rl.N.hi)
    for bad in (rl.N.lo - 1, rl.N.hi + 1):
        with pytest.raises(ValueError):
            Limits(max_n=bad)
    # The request models refuse above N's bound on their own; --max-n narrows it per server.
    assert document(ServedBounds((M,), Limits(max_n=3)))["components"]["schemas"]["CompletionBody"]["properties"][
        "n"]["anyOf"][0]["maximum"] == 3
    assert CompletionBody.model_json_schema()["properties"]["n"]["anyOf"][0]["maximum"] == rl.N.hi


def test_counts_and_names_come_from_one_definition(doc):
    schemas = doc["components"]["schemas"]
    for component in ("ChatBody", "ResponsesBody", "TokenizeChatBody"):
        assert schemas[component]["properties"]["tools"]["anyOf"][0]["maxItems"] == rl.MAX_TOOLS
    assert schemas["FunctionDefinition"]["properties"]["name"]["pattern"] == rl.NAME_PATTERN
    assert schemas["FunctionTool"]["properties"]["name"]["pattern"] == rl.NAME_PATTERN
    assert schemas["JsonSchemaSpec"]["properties"]["name"]["pattern"] == rl.NAME_PATTERN
    assert grammars._NAME.pattern == rl.NAME_PATTERN
    assert TokenizeChatBody.model_json_schema()["properties"]["tools"]["anyOf"][0]["maxItems"] == rl.MAX_TOOLS
    assert CompletionBody.model_json_schema()["properties"]["max_tokens"]["description"].startswith(
        f"default {rl.COMPLETION_MAX_TOKENS_DEFAULT};")


def test_left_out_fields_take_sampling_params_defaults():
    chat = parse_chat({**BASE["ChatBody"]}, Limits()).params
    comp = parse_completion({**BASE["CompletionBody"]}, Limits()).params
    assert chat == SamplingParams()
    assert comp == SamplingParams(max_tokens=rl.COMPLETION_MAX_TOKENS_DEFAULT)


def test_range_contains():
    r = Range(0, 1, lo_open=True)
    assert not r.contains(0) and r.contains(1) and r.contains(0.5) and not r.contains(float("nan"))
    assert Range(1).contains(10**30) and not Range(1).contains(0)
    assert Range(hi=1, hi_open=True).field_kwargs() == {"lt": 1}


def test_a_prompt_fits_the_context_up_to_its_edge():
    """The one check of a prompt against the served model (gateway and engine both run it) at its edges."""
    rl.check_prompt_fits([1] * 8, 0, 10, 8)  # scoring alone may fill the context
    rl.check_prompt_fits([1] * 5, 3, 10, 8)  # prompt + max_tokens == context
    rl.check_prompt_fits([1] * 7, None, 10, 8)  # room for one token
    for prompt, max_tokens, param in (([1] * 8, None, "prompt"), ([1] * 8, 1, "prompt"), ([1] * 9, 0, "prompt"),
                                      ([1] * 5, 4, "max_tokens"), ([1, 10], 1, "prompt"), ([-1], 1, "prompt")):
        with pytest.raises(rl.OutOfBounds) as refused:
            rl.check_prompt_fits(prompt, max_tokens, 10, 8)
        assert refused.value.param == param


@pytest.mark.parametrize("prompt, max_tokens, message", [
    (8, None, "This model's maximum context length is 8 tokens. Input tokens exceed the configured limit of 7 tokens: "
              "your prompt has 8 tokens, which leaves no room for output. Please reduce the length of the prompt."),
    (5, 4, "This model's maximum context length is 8 tokens. Input tokens exceed the configured limit of 4 tokens: "
           "you requested 9 tokens (5 in the prompt, 4 in max_tokens). Please reduce the length of the prompt or "
           "max_tokens."),
    (9, 0, "This model's maximum context length is 8 tokens. Input tokens exceed the configured limit of 8 tokens: "
           "you requested 9 tokens (9 in the prompt, 0 in max_tokens). Please reduce the length of the prompt or "
           "max_tokens."),  # scoring alone may fill the whole context
    # max_tokens alone fills the context: no input would fit, so no input limit is named
    (1, 8, "This model's maximum context length is 8 tokens. However, you requested 9 tokens (1 in the prompt, 8 in "
           "max_tokens). Please reduce the length of the prompt or max_tokens."),
])
def test_a_context_overflow_is_worded_as_clients_match_it(prompt, max_tokens, message):
    """OpenAI's and vLLM's words, which LiteLLM and LangChain match (tests/e2e); a token outside the vocabulary is
    another error."""
    with pytest.raises(rl.ContextOverflow) as refused:
        rl.check_prompt_fits([1] * prompt, max_tokens, 10, 8)
    assert str(refused.value) == message
    assert (refused.value.prompt_tokens, refused.value.max_tokens, refused.value.context_len) == (prompt, max_tokens, 8)
    with pytest.raises(rl.OutOfBounds) as other:
        rl.check_prompt_fits([10], 1, 10, 8)
    assert not isinstance(other.value, rl.ContextOverflow)

"""Schemathesis hooks for the API schema test (loaded through SCHEMATHESIS_HOOKS).

The OpenAPI document states every rule it can; a few rules compare values across fields in ways JSON
Schema cannot (each is in its field's description, and the server answers it with a 400 naming the
field). Generated bodies that break one are left out: they are neither valid nor invalid by the schema,
so no check could judge the answer. Everything else the generator makes is sent as it is, except that
max_tokens above 16 is lowered to 16 (still a valid value) to keep cases fast.
"""

from __future__ import annotations

import json
import os
from typing import Any

import schemathesis

CONTEXT = int(os.environ.get("MILI_SCHEMATHESIS_CONTEXT", "512"))
FAST_MAX_TOKENS = 16
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


# Case hooks run in every phase (coverage included), body hooks only in the fuzzing phase.
@schemathesis.hook
def map_case(context, case):
    case.body = _capped(case.body)
    return case


@schemathesis.hook
def filter_case(context, case) -> bool:
    body = case.body
    if not isinstance(body, dict):
        return True
    chat = case.operation.path.endswith("/chat/completions")
    return not any(broken(body) for broken in (_min_tokens_above_max, _prompt_beyond_context, *(
        (_unknown_named_tool, _tool_declared_twice, _call_arguments_not_json) if chat else ())))


def _capped(body: Any) -> Any:
    """Generation capped at FAST_MAX_TOKENS (chat asks for it when the body names no limit, as it would
    otherwise run to the end of the context); min_tokens follows it down. Valid values stay valid."""
    if not isinstance(body, dict):
        return body
    if "messages" in body and "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_completion_tokens"] = FAST_MAX_TOKENS
    for field in ("max_tokens", "max_completion_tokens"):
        value = body.get(field)
        if _integral(value) and FAST_MAX_TOKENS < value < CONTEXT:
            body[field] = FAST_MAX_TOKENS
    low, high = body.get("min_tokens"), _max_tokens(body)
    if _integral(low) and _integral(high) and 0 <= high < low:
        body["min_tokens"] = high
    return body


def _integral(value: Any) -> bool:
    """An integer as JSON (and the server) reads numbers: 4 and 4.0 alike."""
    return type(value) is int or (type(value) is float and value.is_integer())


def _max_tokens(body: dict) -> Any:
    if "prompt" in body:  # completions
        return COMPLETIONS_DEFAULT_MAX_TOKENS if body.get("max_tokens") is None else body["max_tokens"]
    return body.get("max_completion_tokens") if body.get("max_completion_tokens") is not None \
        else body.get("max_tokens")


def _min_tokens_above_max(body: dict) -> bool:
    low, high = body.get("min_tokens"), _max_tokens(body)
    return _integral(low) and _integral(high) and low > high


def _prompt_beyond_context(body: dict) -> bool:
    prompt, high = body.get("prompt"), _max_tokens(body)
    if not (isinstance(prompt, list) and prompt and _integral(high)):
        return False
    prompts = prompt if isinstance(prompt[0], list) else [prompt]
    return any(isinstance(p, list) and (len(p) + high > CONTEXT or (len(p) == CONTEXT and high != 0))
               for p in prompts)


def _names(body: dict) -> list:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    return [t["function"].get("name") for t in tools
            if isinstance(t, dict) and isinstance(t.get("function"), dict)]


def _unknown_named_tool(body: dict) -> bool:
    choice = body.get("tool_choice")
    if not (isinstance(choice, dict) and isinstance(choice.get("function"), dict)):
        return False
    return choice["function"].get("name") not in _names(body)


def _tool_declared_twice(body: dict) -> bool:
    names = _names(body)
    return len(names) != len(set(map(str, names)))


def _call_arguments_not_json(body: dict) -> bool:
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, str):
                try:
                    json.loads(arguments)
                except ValueError:
                    return True
    return False

"""A request body validated against its model, or the first problem as an OpenAI error object whose
`param` is the dotted path of the offending field (`messages[0].content`, `tools[1].function.name`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gateway.openai.schema import UNSUPPORTED
from gateway.server.errors import ApiError, invalid

M = TypeVar("M", bound=BaseModel)

# Fields whose keys are the client's own (token ids, template variables): a problem inside one names the field.
_MAPS = {"logit_bias", "metadata", "chat_template_kwargs", "parameters", "schema"}
# Discriminated unions (field -> the tag of a node, which picks its model): pydantic's loc names the tag next.
_TAGGED = {"messages": lambda node: node.get("role"), "response_format": lambda node: node.get("type"),
           "format": lambda node: node.get("type")}
# Clearer words than "Input should be ..." for the fields that take one of several shapes.
_SHAPES = {
    "prompt": "must be a string, an array of strings, an array of token ids or an array of token-id arrays, "
              "none of them empty",
    "stop": "must be a non-empty string or an array of non-empty strings",
    "content": "must be a string or an array of text parts (only text parts are supported)",
    "tool_choice": "must be none, auto, required or a named function",
    "input": "must be a non-empty string or a non-empty array of input items (messages, function calls, function "
             "call outputs, reasoning)",
}


def validate(model: type[M], raw: Any, unsupported: tuple[str, ...] = UNSUPPORTED,
             tagged: dict[str, Callable[[dict], Any]] | None = None, shapes: dict[str, str] | None = None) -> M:
    """`unsupported`: the body's fields that MILI accepts only with the value meaning "not used". `tagged`: the
    model's own discriminated unions beyond chat's (field -> the function that reads a node's tag). `shapes`: clearer
    words for its own fields that take one of several shapes (field -> what it must be)."""
    if not isinstance(raw, dict):
        raise invalid("the request body must be a JSON object")
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise _error(e.errors(include_url=False, include_input=False)[0], raw, unsupported,
                     _TAGGED | (tagged or {}), _SHAPES | (shapes or {})) from None


def _error(error: dict[str, Any], raw: dict[str, Any], unsupported: tuple[str, ...],
           tagged: dict[str, Callable[[dict], Any]], shapes: dict[str, str]) -> ApiError:
    loc, kind = error["loc"], error["type"]
    if loc and loc[0] in unsupported:
        return invalid(f"{loc[0]} is not supported by this server", loc[0])
    if kind == "extra_forbidden" and len(loc) == 1:
        return invalid(f"unrecognized request argument: {loc[0]}", str(loc[0]))
    param, through_union = _param(loc, raw, kind, tagged)
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tag = error["ctx"]["discriminator"]
        tag = tag.strip("'") if tag.startswith("'") else "type"  # a function picks input items by their type
        param = f"{param}.{tag}"
    last = param.rsplit(".", 1)[-1]
    if kind == "extra_forbidden":
        message = f"{param} is not supported"
    elif through_union and last in shapes:
        message = f"{param} {shapes[last]}"
    else:
        message = f"{param}: {error['msg'].removeprefix('Value error, ').replace(' found using item_kind()', '')}"
    return invalid(message, param)


def _param(loc: tuple, raw: Any, kind: str, tagged: dict[str, Callable[[dict], Any]]) -> tuple[str, bool]:
    """The dotted path of `loc` in the body, and whether it stopped at a union (the value matched none of the
    field's shapes). pydantic's loc also names the union member it tried (`str`, `list[int]`) and the tag of
    a discriminated union (`user` for a message with role user); walking the body tells those apart from
    field names."""
    path, node, field = "", raw, ""
    items = list(loc)
    while items:
        item = items.pop(0)
        if isinstance(item, int) and isinstance(node, list) and 0 <= item < len(node):
            if not isinstance(node[item], (dict, list)):
                break  # an element of an array of scalars: the array is the param
            path, node = f"{path}[{item}]", node[item]
        elif isinstance(item, str) and isinstance(node, dict) and (item in node or (not items and kind == "missing")):
            path, node, field = (f"{path}.{item}" if path else item), node.get(item), item
            if item in _MAPS:
                break
        elif (isinstance(item, str) and isinstance(node, list) and items and isinstance(items[0], int)
              and 0 <= items[0] < len(node) and isinstance(node[items[0]], dict)):
            continue  # the union member that is an array of objects: the error is inside one of them
        else:
            return path, True  # a union member's name: the value at `path` matched none of its shapes
        tag = tagged.get(field)
        if tag and isinstance(node, dict) and items and items[0] == tag(node):
            items.pop(0)  # the discriminated union's tag: which model the body's role/type chose
    return path, False

"""Constraints beyond `response_format`: vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`,
`json_object`) and its older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` fields, and
llama.cpp's `grammar` (GBNF) and `json_schema` fields, on completions and chat. Each becomes the `answer`
rule of the request's llguidance grammar (grammars.build_grammar), compiled and bounded as a JSON schema's is.

  - json: the schema as response_format's json_schema (non-strict: unknown keywords ignored);
  - regex: the whole answer matches it (Rust regex syntax, which Python's mostly is; `\\d` means [0-9]);
  - choice: the answer is exactly one of the strings;
  - grammar: a Lark grammar (llguidance's dialect, with a `start` rule) or a GBNF one (llama.cpp's, with
    `root`), told apart as llguidance tells them; it compiles as a grammar of its own, so its rule names
    never meet the request grammar's.

A request takes one constraint: two of these fields, or one with response_format or with tools the model may
call, is a 400 naming both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from gateway.server.errors import invalid
from gateway.text.grammars import ResponseFormat, check_schema, lark_string, response_format_rules

# The request fields that carry one, each with its kind ("structured_outputs.<kind>" for vLLM's object).
FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar",
          "grammar": "grammar", "json_schema": "json"}
STRUCTURED_OUTPUTS = ("json", "regex", "choice", "grammar", "json_object")
SUBGRAMMAR = "constraint"  # the name a grammar constraint compiles under, referenced as @constraint


@dataclass(frozen=True)
class OutputConstraint:
    kind: str  # "json", "regex", "choice" or "grammar"
    value: Any  # a JSON schema (dict), a regex, a tuple of choices, or Lark grammar text
    param: str  # the request field it came from, which its errors name


def parse_output_constraint(raw: dict[str, Any], others: tuple[str, ...] = ()) -> OutputConstraint | None:
    """The body's constraint (its shape already validated), or None. `others`: the request's other fields that
    constrain the output already (a JSON response_format, tools the model may call)."""
    given = [(param, kind, raw[param]) for param, kind in FIELDS.items() if raw.get(param) is not None]
    nested = raw.get("structured_outputs") or {}
    given += [(f"structured_outputs.{kind}", kind, nested[kind]) for kind in STRUCTURED_OUTPUTS
              if nested.get(kind) not in (None, False)]
    names = [*others, *(param for param, _, _ in given)]
    if given and len(names) > 1:  # (tools with a response_format are one grammar: tool_specs.py)
        raise invalid(f"a request takes one output constraint; it has {' and '.join(names)}", given[-1][0])
    if not given:
        return None
    param, kind, value = given[0]
    if kind == "json_object":
        return OutputConstraint("json", {"type": "object"}, param)
    if kind == "json":
        return OutputConstraint("json", _schema(value, param), param)
    if kind == "choice":
        return OutputConstraint("choice", tuple(value), param)
    if kind == "grammar":
        try:
            lark = any_to_lark(value)
        except Exception as e:  # the GBNF converter's own errors are of many types; each means a bad grammar
            raise invalid(f"{param}: not a valid Lark or GBNF grammar: {e}", param) from None
        return OutputConstraint("grammar", lark, param)
    return OutputConstraint("regex", value, param)


def _schema(value: Any, param: str) -> dict[str, Any]:
    """vLLM takes a guided_json schema as an object or as JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise invalid(f"{param} must be a JSON schema: an object, or its JSON text", param) from None
    check_schema(value, param)
    return value


def constraint_rules(constraint: OutputConstraint) -> tuple[list[str], dict[str, str]]:
    """The Lark rules defining `answer`, and the grammars they reference by name (build_grammar's arguments)."""
    if constraint.kind == "json":
        return response_format_rules(ResponseFormat(constraint.value, strict=False)), {}
    if constraint.kind == "regex":
        return [f"answer: /{llguidance.regex_to_lark(constraint.value)}/"], {}
    if constraint.kind == "choice":
        return ["answer: " + " | ".join(lark_string(c) for c in constraint.value)], {}
    return [f"answer: @{SUBGRAMMAR}"], {SUBGRAMMAR: constraint.value}

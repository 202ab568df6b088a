"""`response_format` and JSON schemas turned into llguidance grammars, checked here before they reach a
worker.

Output JSON is compact but readable, one fixed layout (`{"a": 1, "b": [2, 3]}`: ", " and ": " as
separators, no other whitespace), so a model cannot spend its tokens on whitespace and a client gets the
same text it would from `json.dumps`. A schema is bounded in size and depth before it is compiled, and
the compile itself runs under llguidance's fuel limits (the ones the worker uses) in a thread, so a
hostile schema is a 400 and never stalls the gateway or a worker.

`strict: true` compiles the schema strictly: a keyword llguidance does not implement (`if`/`then`, `not`,
an unknown `format`, ...) is a 400 that names it. Without strict, such keywords are ignored (the rest of
the schema is still enforced).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from typing import Any

import llguidance
from tokenizers import Tokenizer

from gateway.server.errors import invalid
from shared.grammar_limits import build_tokenizer, parser_limits
from shared.request_limits import (MAX_COMPILE_SECONDS, MAX_SCHEMA_CHARS, MAX_SCHEMA_DEPTH, MAX_SCHEMA_PROPERTIES,
                                   NAME_PATTERN, NAME_RULE)

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_NAME = re.compile(NAME_PATTERN)


def is_valid_name(name: object) -> bool:
    """A function's or a JSON schema's name as OpenAI allows it (shared/request_limits.py's NAME_PATTERN)."""
    return isinstance(name, str) and _NAME.match(name) is not None


@dataclass(frozen=True)
class ResponseFormat:
    """A JSON answer: any object (json_object) or one that validates against `schema`."""

    schema: dict[str, Any]
    strict: bool


def parse_response_format(value: Any) -> ResponseFormat | None:
    """The request's response_format; None for text (or absent)."""
    if value is None:
        return None
    param = "response_format"
    if not isinstance(value, dict):
        raise invalid("response_format must be an object", param)
    kind = value.get("type")
    fields = {"json_object": {"schema", "value"}, "json_schema": {"json_schema"}}.get(kind, set()) \
        if isinstance(kind, str) else set()
    unknown = sorted(set(value) - {"type"} - fields)
    if unknown:
        raise invalid(f"response_format.{unknown[0]} is not supported", param)
    if kind == "text":
        return None
    if kind == "json_object":
        return _json_object(value)
    if kind != "json_schema":
        raise invalid("response_format.type must be text, json_object or json_schema", "response_format.type")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid("response_format.json_schema must be an object", "response_format.json_schema")
    name = spec.get("name")
    if not is_valid_name(name):
        raise invalid(f"response_format.json_schema.name must be {NAME_RULE}", "response_format.json_schema.name")
    unknown = sorted(set(spec) - {"name", "description", "schema", "strict"})
    if unknown:
        raise invalid(f"response_format.json_schema.{unknown[0]} is not supported", "response_format.json_schema")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid("response_format.json_schema.strict must be a boolean", "response_format.json_schema.strict")
    schema = spec.get("schema", {})
    check_schema(schema, "response_format.json_schema.schema")
    return ResponseFormat(schema, strict=bool(strict))


def _json_object(value: dict[str, Any]) -> ResponseFormat:
    """Any JSON object, or with llama.cpp's `schema` (TGI's `value`; schema wins) an answer that validates against
    it, not strictly."""
    for name in ("schema", "value"):
        if value.get(name) is not None:
            check_schema(value[name], f"response_format.{name}")
            return ResponseFormat(value[name], strict=False)
    return ResponseFormat({"type": "object"}, strict=False)


def check_schema(schema: Any, param: str) -> None:
    """Shape and size limits on a JSON schema from a request (before any compile)."""
    if not isinstance(schema, dict):
        raise invalid(f"{param} must be a JSON schema object", param)
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        raise invalid(f"{param} is larger than {MAX_SCHEMA_CHARS} characters", param)
    depth, properties = _measure(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise invalid(f"{param} nests {depth} levels deep; at most {MAX_SCHEMA_DEPTH} are allowed", param)
    if properties > MAX_SCHEMA_PROPERTIES:
        raise invalid(f"{param} declares {properties} object properties; at most {MAX_SCHEMA_PROPERTIES} "
                      "are allowed", param)


def _measure(value: Any) -> tuple[int, int]:
    """(nesting depth, number of entries in "properties" maps) of a JSON schema document, without
    recursion (a hostile document may be very deep)."""
    deepest, properties, stack = 0, 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if isinstance(item, dict) and isinstance(item.get("properties"), dict):
                properties += len(item["properties"])
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest, properties


def json_options(strict: bool) -> dict[str, Any]:
    """llguidance's JSON compile options: the fixed layout; lenient (unknown keywords ignored) unless strict."""
    return {**JSON_LAYOUT, "lenient": not strict}


def lark_string(text: str) -> str:
    """A Lark string literal matching exactly `text`: JSON's escapes, non-ASCII kept as UTF-8, and DEL escaped
    (llguidance's lexer refuses a raw U+007F inside a literal)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def schema_lark(schema: dict[str, Any], strict: bool) -> str:
    """A schema as the argument of Lark's %json, carrying its compile options."""
    return json.dumps({**schema, "x-guidance": json_options(strict)}, ensure_ascii=False)


def response_format_rules(fmt: ResponseFormat) -> list[str]:
    return [f"answer: %json {schema_lark(fmt.schema, fmt.strict)}"]


def free_text_rules() -> list[str]:
    """An unconstrained answer (for a request whose only constraint is its reasoning budget)."""
    return ["answer: /(.|\\n)*/"]


# How the output may open with reasoning (Qwen3's <think>...</think>) before the constrained answer:
# "none": no reasoning (the model has no think tokens, or the prompt closed the block already);
# "open": the prompt ends inside <think>; "optional": the model may open a think block itself.
_REASONING_START = {"none": "start: answer", "open": "start: think answer",
                    "optional": "start: (<think> think)? answer"}


def build_grammar(answer_rules: list[str], reasoning: str, grammars: dict[str, str] | None = None,
                  think_budget: int | None = None) -> str:
    """The llguidance grammar for a request: reasoning (free text, which cannot contain </think>: it is
    matched as the token) first where the model thinks, then the rules' `answer`. `grammars`: Lark grammars
    the rules reference by name (`@name`), each compiled on its own, so its rule names are its own. With
    `think_budget` the reasoning is at most that many tokens: llguidance's max_tokens on its rule then forces
    </think>."""
    rules = ["%llguidance {}", _REASONING_START[reasoning], *answer_rules]
    if reasoning != "none":
        # At most a few blanks between the reasoning and the answer (Qwen3 writes "\n\n"): unbounded,
        # a model could fill max_tokens with them.
        if think_budget is None:
            rules += ["think: THINK </think> /[ \\n]{0,4}/", "THINK: /(.|\\n)*/"]
        else:  # llguidance bounds rules, not terminals
            rules += ["think: thought </think> /[ \\n]{0,4}/", f"thought[max_tokens={think_budget}]: /(.|\\n)*/"]
    main = llguidance.LLMatcher.grammar_from_lark("\n".join(rules) + "\n")
    if not grammars:
        return main
    return json.dumps({"grammars": [{"lark_grammar": main},
                                    *({"name": name, "lark_grammar": text} for name, text in grammars.items())]},
                      ensure_ascii=False)


class GrammarChecker:
    """Compiles grammars once in the gateway, with the served tokenizer and the worker's limits, to turn
    every grammar error into a 400 before a request is submitted."""

    def __init__(self, tokenizer: Tokenizer):
        self._source = tokenizer
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._lock = asyncio.Lock()

    async def check(self, grammar: str, param: str) -> None:
        async with self._lock:  # one compile at a time: the first builds the tokenizer (about 0.2 s)
            if self._tokenizer is None:
                await asyncio.to_thread(self._build_tokenizer)
            started = time.monotonic()
            error = await asyncio.to_thread(self._validate, grammar)
            took = time.monotonic() - started
        if not error and took > MAX_COMPILE_SECONDS:
            error = f"it took {took:.1f} s to compile (the limit is {MAX_COMPILE_SECONDS} s); simplify it"
        if error:
            raise invalid(f"{param}: the schema or grammar is not supported: {error}", param)

    def _build_tokenizer(self) -> None:
        self._tokenizer = build_tokenizer(self._source.to_str(), self._source.get_vocab_size(), [])

    def _validate(self, grammar: str) -> str:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self._tokenizer, limits=parser_limits())
        return _first_line(messages[0]) if is_error else ""


MAX_ERROR_CHARS = 500


def _first_line(message: str) -> str:
    """llguidance's error, less the grammar listing it may append (the whole schema again, which a client
    sent and does not need back), and bounded. A regex error's reason comes on a line of its own
    ("error: look-around ... is not supported"), which is kept."""
    lines = message.strip().split("\n")
    reason = next((f" ({line.strip()})" for line in lines[1:] if line.strip().startswith("error:")), "")
    line = lines[0] + reason
    return line if len(line) <= MAX_ERROR_CHARS else line[:MAX_ERROR_CHARS] + "..."

"""Function tools: the request fields (`tools`, `tool_choice`, `parallel_tool_calls`), how tools reach the
prompt, and the grammar that makes the model's calls valid.

The call format is the one Qwen2.5/Qwen3 (Hermes) templates teach their models, and the one MILI
describes itself to models whose template has no tool support (the "generic" format):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

with parallel calls one after another, separated by a newline. Decoding is constrained by an llguidance
grammar built per request:
  - `required`: one call (or several, with parallel_tool_calls) to a declared function, and nothing else;
  - named: exactly one call to that function;
  - `auto`: free text that must not contain `<tool_call>`, or text followed by calls. The call part is a
    lazy trigger: the text is free until `<tool_call>` appears, and from there the call is constrained;
    with a response_format the text alternative is that JSON instead;
  - `none`: no grammar, and the tools are left out of the prompt (the model is not asked to call any).
Arguments follow the function's `parameters` schema (strictly when the tool says `strict: true`, else
its unsupported keywords are ignored). `parallel_tool_calls: false` ends the output after the first call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gateway.server.errors import invalid
from gateway.text.grammars import ResponseFormat, check_schema, is_valid_name, lark_string, schema_lark
from shared.request_limits import MAX_TOOLS, NAME_RULE

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
EMPTY_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict[str, Any]
    strict: bool

    def as_openai(self) -> dict[str, Any]:
        """The tool as chat templates expect it (the OpenAI request shape, as transformers passes it)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolSpec:
    tools: tuple[Tool, ...]
    choice: str  # "none", "auto", "required" or "named"
    named: str | None  # the function tool_choice names
    parallel: bool

    @property
    def calls_possible(self) -> bool:
        return self.choice != "none"

    @property
    def calls_only(self) -> bool:
        """The grammar allows calls and nothing else (no free text)."""
        return self.choice in ("required", "named")

    def finish_reason(self, made_calls: bool, reason: str | None) -> str | None:
        """OpenAI's: "tool_calls" when the model stopped after calling, except for a named tool_choice."""
        if made_calls and reason == "stop" and self.choice != "named":
            return "tool_calls"
        return reason


def parse_tools(tools: Any, choice: Any, parallel: Any) -> ToolSpec | None:
    """The three request fields; None when no tools are declared (and tool_choice allows that)."""
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    declared = _tools(tools)
    mode, named = _choice(choice, declared)
    if not declared:
        return None
    return ToolSpec(declared, mode, named, parallel is not False)


def _tools(tools: Any) -> tuple[Tool, ...]:
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise invalid("tools must be an array", "tools")
    if len(tools) > MAX_TOOLS:
        raise invalid(f"at most {MAX_TOOLS} tools are allowed, got {len(tools)}", "tools")
    out: list[Tool] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise invalid(f"{where} must be an object with type \"function\" (other tool types are not supported)",
                          f"{where}.type")
        unknown = sorted(set(tool) - {"type", "function"})
        if unknown:
            raise invalid(f"{where}.{unknown[0]} is not supported", f"{where}.{unknown[0]}")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise invalid(f"{where}.function must be an object", f"{where}.function")
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise invalid(f"{where}.function.{unknown[0]} is not supported", f"{where}.function.{unknown[0]}")
        name = fn.get("name")
        if not is_valid_name(name):
            raise invalid(f"{where}.function.name must be {NAME_RULE}", f"{where}.function.name")
        if any(t.name == name for t in out):
            raise invalid(f"{where}.function.name {name!r} is declared twice", f"{where}.function.name")
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise invalid(f"{where}.function.description must be a string", f"{where}.function.description")
        strict = fn.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise invalid(f"{where}.function.strict must be a boolean", f"{where}.function.strict")
        parameters = fn.get("parameters")
        if parameters is None:
            parameters = EMPTY_PARAMETERS  # "omitting parameters defines a function with an empty parameter list"
        check_schema(parameters, f"{where}.function.parameters")
        out.append(Tool(name, description, parameters, bool(strict)))
    return tuple(out)


def _choice(choice: Any, tools: tuple[Tool, ...]) -> tuple[str, str | None]:
    param = "tool_choice"
    if choice is None:
        return ("auto" if tools else "none"), None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise invalid("tool_choice must be none, auto, required or a named function", param)
        if choice == "required" and not tools:
            raise invalid("tool_choice required needs at least one tool in tools", param)
        return choice, None
    if not (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)):
        raise invalid("tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": "
                      "{\"name\": ...}}", param)
    name = choice["function"].get("name")
    if not any(t.name == name for t in tools):
        raise invalid(f"tool_choice names the function {name!r}, which is not in tools", param)
    return "named", name


# ----- the prompt -----

GENERIC_INSTRUCTIONS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}}\n</tool_call>")


def generic_messages(messages: list[dict[str, Any]], spec: ToolSpec | None) -> list[dict[str, Any]]:
    """A conversation for a template that knows nothing of tools: the tools described in the system
    message, earlier calls written out in the call format, tool results as user messages."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "\n".join(format_call(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"])
            text = m.get("content") or ""
            out.append({"role": "assistant", "content": f"{text}\n{calls}" if text else calls})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content", "name")})
    if spec is not None and spec.calls_possible:
        described = GENERIC_INSTRUCTIONS.format(tools="\n".join(json.dumps(t.as_openai(), ensure_ascii=False)
                                                                for t in spec.tools))
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{described}"}
        else:
            out.insert(0, {"role": "system", "content": described})
    return out


def format_call(name: str, arguments: Any) -> str:
    return f"{CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{CALL_CLOSE}"


# ----- the grammar -----

def call_prefix(name: str) -> str:
    """What a call to `name` starts with, up to its arguments (the parser in tool_call_parser.py reads this)."""
    return '{"name": ' + json.dumps(name) + ', "arguments": '


def lark_tag(tag: str, is_token: bool) -> str:
    """A tag in a Lark grammar: by token where the tokenizer has it as one (llguidance matches added
    tokens by id, not by their text), else as text."""
    return tag if is_token else lark_string(tag)


def tool_grammar_rules(spec: ToolSpec, response_format: ResponseFormat | None, tags_are_tokens: bool) -> list[str]:
    """Lark rules defining `answer` for the request's tool_choice (not for `none`, which has no grammar)."""
    tools = [t for t in spec.tools if spec.choice != "named" or t.name == spec.named]
    open_, close = lark_tag(CALL_OPEN, tags_are_tokens), lark_tag(CALL_CLOSE, tags_are_tokens)
    call = f'{open_} "\\n" body "\\n" {close}'
    more = f' ("\\n" {call})*' if spec.parallel else ""
    rules = []
    if spec.choice in ("named", "required"):
        rules.append(f"answer: {call}{more if spec.choice == 'required' else ''}")
    elif response_format is not None:
        # A JSON answer starts with "{", a call with "<": no trigger needed to tell them apart.
        rules.append(f"answer: json_answer | {call}{more}")
        rules.append(f"json_answer: %json {schema_lark(response_format.schema, response_format.strict)}")
    elif tags_are_tokens:
        # TEXT cannot produce the tag's token, so the call starts exactly where that token is sampled.
        rules.append(f"answer: TEXT | TEXT {call}{more}")
    else:
        # The call is a lazy trigger: free text until the opening tag, constrained from there.
        rules.append(f'answer: TEXT | head "\\n" body "\\n" {close}{more}')
        rules.append(f"head[lazy]: TEXT {open_}")
    if spec.choice == "auto" and response_format is None:
        # Text must not spell out the opening either, or a malformed call could hide in it.
        rules.append("TEXT: /(.|\\n)*/ & ~/(.|\\n)*" + re.escape(CALL_OPEN).replace("/", "\\/") + "(.|\\n)*/")
    rules.append("body: " + " | ".join(f"call_{i}" for i in range(len(tools))))
    for i, tool in enumerate(tools):
        rules.append(f"call_{i}: {lark_string(call_prefix(tool.name))} args_{i} \"}}\"")
        rules.append(f"args_{i}: %json {schema_lark(tool.parameters, tool.strict)}")
    return rules



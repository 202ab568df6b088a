"""A choice's content turned into text and tool calls as it streams.

The grammar (tool_specs.py) fixes the call format, so the parser reads it exactly: text up to `<tool_call>`,
then `\\n{"name": "NAME", "arguments": `, then the arguments, then `}\\n</tool_call>`; parallel calls follow
after a newline. The arguments are one JSON value, and they end where that value ends (a JSON scan finds
it: strings, escapes and nesting), never where the closing text is found, so the wrapper cannot end up in
them however the output is cut. Every piece it emits is final: text that could still be the start of
`<tool_call>` is held back until the next piece decides (as stop strings are). A call's id, type and name
go out once, when its name is complete; its arguments then go out piece by piece. The non-streamed
response is assembled from the same pieces, so the two are equal by construction.

The one rule for output that stops early (max_tokens, a stop string): only the model's argument text and
its free text leave the parser, never the call format's own text. A call cut short keeps its partial
arguments (a prefix of the uncut call's); a call cut inside its opening, before its name is complete, is
dropped, as is a cut closing or a cut opening of a next call. Where the grammar allows no text
(`calls_only`: a required or named tool_choice), a cut `<tool_call>` is dropped too.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from gateway.text.tool_specs import CALL_CLOSE, CALL_OPEN

_HEADER = re.compile(r'\n\{"name": "([a-zA-Z0-9_-]{1,64})", "arguments": ')
_HEADER_LEAD, _HEADER_TAIL = '\n{"name": "', '", "arguments": '
_NAME_CHARS = re.compile(r"[a-zA-Z0-9_-]{0,64}")
_ARGS_END = "}\n" + CALL_CLOSE
_BETWEEN = "\n" + CALL_OPEN
_SCALAR_CHARS = frozenset("0123456789+-.eEtruefalsn")


@dataclass
class ToolCallDelta:
    """One piece of one call: the first carries id and name (and the argument text that came with
    them, if any); the rest carry argument text only. One feed gives at most one piece per call, so a
    stream chunk never names a call twice (clients that read a chunk's first entry miss nothing)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


class ToolCallParser:
    def __init__(self, calls_only: bool = False) -> None:
        self.calls_only = calls_only
        self.state = "text"  # "text" | "header" | "arguments" | "closing" | "between"
        self.buf = ""
        self.num_calls = 0
        self.scan = _JsonValueEnd()

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """(content text, call pieces) for the next piece of content."""
        self.buf += text
        content, calls = "", []
        while True:
            if self.state == "text":
                at = self.buf.find(CALL_OPEN)
                if at < 0:
                    keep = partial_suffix_length(self.buf, CALL_OPEN)
                    content += self.buf[:len(self.buf) - keep]
                    self.buf = self.buf[len(self.buf) - keep:]
                    return content, calls
                content += self.buf[:at]
                self.buf, self.state = self.buf[at + len(CALL_OPEN):], "header"
            elif self.state == "header":
                match = _HEADER.match(self.buf)
                if match is None:
                    if not _header_viable(self.buf):
                        # Not our format (no grammar made it): it stays text.
                        content += CALL_OPEN + self.buf
                        self.buf, self.state = "", "text"
                    return content, calls
                calls.append(ToolCallDelta(self.num_calls, new_call_id(), match.group(1)))
                self.buf, self.state, self.scan = self.buf[match.end():], "arguments", _JsonValueEnd()
            elif self.state == "arguments":
                end = self.scan.end_in(self.buf)
                if end is None:
                    self._arguments(calls, self.buf)
                    self.buf = ""
                    return content, calls
                self._arguments(calls, self.buf[:end])
                self.buf, self.state = self.buf[end:], "closing"
                self.num_calls += 1
            elif self.state == "closing":  # the rest of the wrapper: `}\n</tool_call>`
                if self.buf.startswith(_ARGS_END):
                    self.buf, self.state = self.buf[len(_ARGS_END):], "between"
                elif _ARGS_END.startswith(self.buf):
                    return content, calls
                else:
                    self.state = "text"  # not our format after the arguments: what follows is text
            else:  # between calls: a newline and the next opening, or the end
                if _BETWEEN.startswith(self.buf):
                    return content, calls
                if self.buf.startswith(_BETWEEN):
                    self.buf, self.state = self.buf[len(_BETWEEN):], "header"
                else:
                    self.state = "text"

    def flush(self) -> tuple[str, list[ToolCallDelta]]:
        """The held-back rest when the output ends: text only where it is free text (see the module's
        rule); a cut opening, closing or next opening is the call format's, and goes nowhere."""
        rest, self.buf = self.buf, ""
        if self.state == "text" and not self.calls_only:
            return rest, []
        return "", []

    def _arguments(self, calls: list[ToolCallDelta], text: str) -> None:
        if not text:
            return
        if calls and calls[-1].index == self.num_calls:  # this call's header came in the same feed
            calls[-1].arguments += text
        else:
            calls.append(ToolCallDelta(self.num_calls, arguments=text))


class _JsonValueEnd:
    """Where one JSON value ends, in text that arrives in pieces: after the bracket that closes its
    outermost object or array, after the quote that closes a top-level string, or before the first
    character that cannot continue a top-level number or literal."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.in_scalar = False

    def end_in(self, text: str) -> int | None:
        """The offset in text just past the value's end, or None if it goes on past text."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return i + 1
            elif self.in_scalar:
                if ch not in _SCALAR_CHARS:
                    return i
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                if self.depth == 0:
                    return i  # no value at all (not our format)
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
            elif self.depth == 0 and not ch.isspace():
                self.in_scalar = True
        return None


def _header_viable(buf: str) -> bool:
    """Whether buf can still grow into a call header."""
    if len(buf) <= len(_HEADER_LEAD):
        return _HEADER_LEAD.startswith(buf)
    if not buf.startswith(_HEADER_LEAD):
        return False
    rest = buf[len(_HEADER_LEAD):]
    return _HEADER_TAIL.startswith(rest[_NAME_CHARS.match(rest).end():])


def partial_suffix_length(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def assemble(deltas: list[ToolCallDelta]) -> list[dict]:
    """The message's tool_calls from all of a choice's pieces."""
    calls: list[dict] = []
    for d in deltas:
        if d.id is not None:
            calls.append({"id": d.id, "type": "function", "function": {"name": d.name, "arguments": ""}})
        calls[d.index]["function"]["arguments"] += d.arguments
    return calls

"""A choice's content turned into text and tool calls as it streams.

The grammar (tool_specs.py) fixes the call format, so the parser reads it exactly: text up to `<tool_call>`,
then `\\n{"name": "NAME", "arguments": `, then the arguments, then `}\\n</tool_call>`; parallel calls follow
after a newline. Every piece it emits is final: text that could still be the start of `<tool_call>`
and argument text that could be the start of the closing `}\\n</tool_call>` are held back until the next
piece decides (as stop strings are). A call's id, type and name go out once, when its name is complete;
its arguments then go out piece by piece. The non-streamed response is assembled from the same pieces,
so the two are equal by construction.

Output that stops early (max_tokens, a stop string) keeps what was generated: a call cut short keeps its
partial arguments; a call opening cut short before its name is complete is returned as text.
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


@dataclass
class ToolCallDelta:
    """One piece of one call: the first carries id and name (and no arguments); the rest carry
    argument text only."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


class ToolCallParser:
    def __init__(self) -> None:
        self.state = "text"  # "text" | "header" | "arguments" | "between"
        self.buf = ""
        self.num_calls = 0

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
                self.buf, self.state = self.buf[match.end():], "arguments"
            elif self.state == "arguments":
                at = self.buf.find(_ARGS_END)
                if at < 0:
                    keep = partial_suffix_length(self.buf, _ARGS_END)
                    self._arguments(calls, self.buf[:len(self.buf) - keep])
                    self.buf = self.buf[len(self.buf) - keep:]
                    return content, calls
                self._arguments(calls, self.buf[:at])
                self.buf, self.state = self.buf[at + len(_ARGS_END):], "between"
                self.num_calls += 1
            else:  # between calls: a newline and the next opening, or the end
                if _BETWEEN.startswith(self.buf):
                    return content, calls
                if self.buf.startswith(_BETWEEN):
                    self.buf, self.state = self.buf[len(_BETWEEN):], "header"
                else:
                    self.state = "text"

    def flush(self) -> tuple[str, list[ToolCallDelta]]:
        """The held-back rest when the output ends."""
        rest, self.buf = self.buf, ""
        if self.state == "arguments":
            calls: list[ToolCallDelta] = []
            self._arguments(calls, rest)
            return "", calls
        if self.state == "header":
            return CALL_OPEN + rest, []
        return rest, []

    def _arguments(self, calls: list[ToolCallDelta], text: str) -> None:
        if text:
            calls.append(ToolCallDelta(self.num_calls, arguments=text))


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
